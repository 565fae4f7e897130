"""The read side of a ``serve --group`` member: which reads it answers itself, and which it forwards.

A member answers a read from its own projection only when it **holds** the read's partition (the
group's last generation gave it to this member) **and is live** on it: since it gained the partition
its applied offset has reached the partition's end offset at least once, so the reader's own bounded
wait covers what it is behind. Otherwise (a partition it never held or lost, or one it is still
catching up on from the offsets in its file) it forwards the read to a member the owner map names
for that partition (``throughline.serve.forward``: one hop, the caller's ``Authorization``, the answer
unchanged, bounded time) and returns that answer. A read another member forwarded here is always
answered here (one hop). When no other holder answers:

- a held partition is answered locally (still never stale: the reader compares its applied offset with
  the log's end offset and answers ``projection_pending`` when it is behind);
- a partition this member does not hold fails ``forward_failed`` (HTTP 503, retriable), so that the
  client fails over to the next member; its rows in this file are never served.

Between generations (joining, or dropped and rejoining) a read first waits for the next generation,
at most the reader's bounded wait (``read_wait``), and is then routed as above: a member that has just
started has nothing in its file a peer could not answer better, and its first generation is usually a
second or two away. When none comes in time the read is answered locally, honestly for the same reason
(``projection_pending`` while the file is behind): the slowest answer is then twice the bounded wait.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable, Mapping
from typing import Any

from throughline.core.identity import project_sha256
from throughline.core.ports import LogView
from throughline.errors import ThroughlineError
from throughline.log.group import GroupView
from throughline.serve.exceptions import ForwardFailedError
from throughline.serve.forward import ForwardedRead, forward_read, is_forwarded

#: Added to the holder's own bounded wait and long-poll when a member forwards a read.
FORWARD_MARGIN = 5.0


class Membership:
    """What this member knows of its group now: the last ``GroupView`` and the partitions it is live on.

    ``on_change`` is the ``GroupConsumer``'s callback (kafka-python's IO thread); the rest is asked by
    request threads. Thread-safe.
    """

    def __init__(self, group: str, url: str, copies: int | None) -> None:
        self.group = group
        self.url = url.rstrip("/")
        self.copies = copies
        self._lock = threading.Lock()
        self._generation_came = threading.Condition(self._lock)
        self._view: GroupView | None = None
        self._live: set[int] = set()

    def on_change(self, view: GroupView) -> None:
        """A new generation: partitions it no longer holds stop being live."""
        with self._lock:
            self._view = view
            self._live &= set(view.assigned)
            self._generation_came.notify_all()

    def on_leave(self) -> None:
        """Dropped from the group, or the projector's run ended: nothing is held until the next generation."""
        with self._lock:
            self._view = None
            self._live.clear()

    @property
    def view(self) -> GroupView | None:
        """The last generation's view (``None`` while joining)."""
        with self._lock:
            return self._view

    def await_view(self, timeout: float) -> GroupView | None:
        """The last generation's view; between generations, the next one's, waiting at most ``timeout``
        seconds for it (``None``: none came). Called by request threads; wakes when ``on_change`` runs."""
        with self._generation_came:
            self._generation_came.wait_for(lambda: self._view is not None, max(0.0, timeout))
            return self._view

    def held(self) -> frozenset[int]:
        """The partitions the last generation gave this member."""
        view = self.view
        return frozenset() if view is None else view.assigned

    def is_live(self, partition: int, applied: int, end: Callable[[], int]) -> bool:
        """Whether this member holds ``partition`` and has caught up on it since it gained it."""
        with self._lock:
            view = self._view
            if view is None or partition not in view.assigned:
                return False
            if partition in self._live:
                return True
        if applied < end():
            return False
        with self._lock:
            if self._view is view:  # not across a generation that may have taken it away again
                self._live.add(partition)
        return True

    def observe(self, applied: Mapping[int, int], end: Mapping[int, int] | None) -> None:
        """Mark every held partition whose applied offset reached ``end`` live (``/readyz`` asks this)."""
        if end is None:
            return
        for p in sorted(self.held()):
            reached = end.get(p, 0)
            self.is_live(p, applied.get(p, 0), lambda reached=reached: reached)  # type: ignore[misc]

    def live(self) -> frozenset[int]:
        """The partitions this member answers itself."""
        with self._lock:
            return frozenset(self._live)

    def report(self, applied: Mapping[int, int], end: Mapping[int, int] | None) -> dict[str, Any]:
        """The ``group`` object of ``/readyz``: this member, the generation, every member's partitions."""
        view = self.view
        doc: dict[str, Any] = {"name": self.group, "url": self.url, "copies": self.copies, "joined": view is not None}
        if view is None:
            return doc
        self.observe(applied, end)
        held = sorted(view.assigned)
        live = self.live()
        doc.update(
            generation=view.generation,
            memberId=view.member_id,
            held=held,
            catchingUp=[p for p in held if p not in live],
            heldLag=None if end is None else sum(max(0, end.get(p, 0) - applied.get(p, 0)) for p in held),
        )
        owner_map = view.owner_map
        if owner_map is None:
            doc["error"] = view.error
            return doc
        doc["copies"] = owner_map.copies
        doc["members"] = [
            {"id": m.member_id, "url": m.url, "partitions": sorted(owner_map.partitions_of(m.member_id))}
            for m in owner_map.members
        ]
        return doc


class GroupRouter:
    """Decides, per read, whether this member answers it or forwards it (see the module)."""

    def __init__(
        self,
        membership: Membership,
        log: LogView,
        applied: Callable[[int], int],
        read_wait: float,
        context: ssl.SSLContext | None = None,
    ) -> None:
        self.membership = membership
        self._context = context
        self.log = log
        self._applied = applied
        self._read_wait = read_wait

    def route(
        self,
        project: object,
        *,
        wait: float,
        method: str,
        target: str,
        body: bytes | None,
        headers: Mapping[str, str],
    ) -> ForwardedRead | None:
        """``None``: answer the read here; else the answer of the member it was forwarded to."""
        if is_forwarded(headers):
            return None
        view = self.membership.await_view(self._read_wait)
        if view is None or view.owner_map is None:
            return None
        try:
            partition = self.log.partition_of(project_sha256(project))  # type: ignore[arg-type]
        except ThroughlineError:
            return None  # the local read reports the project's fault
        except (TypeError, ValueError):
            return None
        held = partition in view.assigned
        if held and self.membership.is_live(
            partition, self._applied(partition), lambda: self.log.end_offset(partition)
        ):
            return None
        holders = [u for u in view.owner_map.urls(partition) if u.rstrip("/") != self.membership.url]
        if not holders:
            if held:
                return None
            raise ForwardFailedError(f"no member holds partition {partition} in generation {view.generation}")
        try:
            return forward_read(
                holders,
                method=method,
                target=target,
                body=body,
                headers=headers,
                via=self.membership.url,
                timeout=self._read_wait + max(0.0, wait) + FORWARD_MARGIN,
                context=self._context,
            )
        except ForwardFailedError:
            if held:
                return None
            raise
