"""``SwitchableProjection``: the ``Projection`` port over one projection handle that can be replaced while
readers use it (``serve --rebuild`` switches reads from the old file to the rebuilt one).

One owner: the current handle, the switch count (``epoch``) and the count of reads in flight per handle
are this object's, changed only under its lock. Handles are never shared back: a read takes the current
handle and counts itself on it for as long as it reads, so a read that began on the old handle ends on it,
and the switch waits (bounded) until the old handle has no read in flight before its caller retires it
(and closes it later).

Waits carry over a switch: a wait that was waiting on the old handle is woken when that handle is
retired or closes (the port's promise for a closed projection), sees that the handle changed and goes on
waiting on the new one for the rest of its time. Change counts (``project_changes``) carry the epoch in their high bits, so a
count read before the switch is below every count read after it: a long-poll waiting with an old count
wakes and reads again (one extra read), never misses a commit of the new handle.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Generic, Protocol, TypeVar

from throughline.core.ports import Projection, ProjectionView, QuarantineReport

T = TypeVar("T")

#: A handle's own change counts stay below this: the epoch is added above it.
EPOCH_UNIT = 1 << 48
#: Handles a wait follows across switches before it answers with what it has (a switch is rare).
MAX_SWITCHES_FOLLOWED = 16


class SwitchableHandle(Projection, Protocol):
    """What the facade delegates to: the port plus the applied offsets (``DuckProjection`` has both)."""

    def applied_offsets(self) -> Mapping[int, int]:
        """The next offset to apply per partition, as committed."""
        ...

    def close(self) -> None:
        """Close the handle; waits on it return at once."""
        ...

    def retire(self) -> None:
        """Wake the waits on the handle and refuse new reads; its writer may still finish (``close`` later)."""
        ...

    def discard(self) -> None:
        """``close``, writing nothing more into the file (it is removed next)."""
        ...


H = TypeVar("H", bound=SwitchableHandle)


class SwitchableProjection(Generic[H]):
    """Implements the ``Projection`` port by delegating to the current handle; ``switch`` replaces it."""

    def __init__(self, current: H) -> None:
        self._cond = threading.Condition()
        self._current = current
        self._epoch = 0
        self._reading: dict[int, int] = {}  # id(handle) -> reads in flight on it

    # ------------------------------------------------------------------ the switch

    @property
    def current(self) -> H:
        """The handle new reads go to."""
        with self._cond:
            return self._current

    @property
    def epoch(self) -> int:
        """How many switches happened."""
        with self._cond:
            return self._epoch

    def reads_in_flight(self, handle: H) -> int:
        """Reads counted on ``handle`` right now."""
        with self._cond:
            return self._reading.get(id(handle), 0)

    def switch(self, new: H, drain_timeout: float) -> tuple[H, bool]:
        """Send every new read to ``new``; wait (at most ``drain_timeout`` seconds) until the reads in flight
        on the old handle are done. Returns the old handle (the caller retires or closes it: that wakes the
        waits still on it) and whether it drained in time."""
        with self._cond:
            old = self._current
            self._current = new
            self._epoch += 1
            self._cond.notify_all()
            drained = self._cond.wait_for(lambda: self._reading.get(id(old), 0) == 0, drain_timeout)
        return old, drained

    def close(self) -> None:
        """Close the current handle (the service's shutdown)."""
        self.current.close()

    # ------------------------------------------------------------------ reads

    def _enter(self) -> H:
        with self._cond:
            handle = self._current
            self._reading[id(handle)] = self._reading.get(id(handle), 0) + 1
            return handle

    def _leave(self, handle: H) -> None:
        with self._cond:
            left = self._reading[id(handle)] - 1
            if left:
                self._reading[id(handle)] = left
            else:
                del self._reading[id(handle)]
                self._cond.notify_all()

    @contextmanager
    def _reading_on(self) -> Iterator[H]:
        handle = self._enter()
        try:
            yield handle
        finally:
            self._leave(handle)

    @contextmanager
    def view(self) -> Iterator[ProjectionView]:
        """One snapshot of the current handle; the handle stays open until the block ends."""
        with self._reading_on() as handle, handle.view() as view:
            yield view

    def read(self, answer: Callable[[ProjectionView], T]) -> T:
        """``answer`` of one snapshot of the current handle (every retry inside it on that same handle)."""
        with self._reading_on() as handle:
            return handle.read(answer)

    def quarantine(self, project_sha256: bytes | None = None, *, times: bool = True) -> QuarantineReport | None:
        """The current handle's quarantine listing."""
        with self._reading_on() as handle:
            return handle.quarantine(project_sha256, times=times)

    def readable_offsets(self) -> Mapping[int, int]:
        """The current handle's readable offsets."""
        with self._reading_on() as handle:
            return handle.readable_offsets()

    def committed_offsets(self) -> Mapping[int, int] | None:
        """The current handle's committed offsets."""
        with self._reading_on() as handle:
            return handle.committed_offsets()

    def applied_offsets(self) -> Mapping[int, int]:
        """The current handle's applied offsets."""
        with self._reading_on() as handle:
            return handle.applied_offsets()

    # ------------------------------------------------------------------ waits

    def _follow(self, wait: Callable[[H, float], bool], timeout: float) -> bool:
        """``wait`` on the current handle; when it returns early because the handle was switched (and
        closed), on the new one for the rest of ``timeout``."""
        deadline = time.monotonic() + max(0.0, timeout)
        for _ in range(MAX_SWITCHES_FOLLOWED):
            with self._cond:
                handle, epoch = self._current, self._epoch
            if wait(handle, max(0.0, deadline - time.monotonic())):
                return True
            with self._cond:
                if self._epoch == epoch:
                    return False  # its own answer: out of time, or the service's projection closed
        return False

    def wait_applied(self, partition: int, offset: int, timeout: float) -> bool:
        """``wait_applied`` of the current handle, carried over a switch."""
        return self._follow(lambda h, t: h.wait_applied(partition, offset, t), timeout)

    def wait_settled(self, partition: int, project_sha256: bytes, offset: int, timeout: float) -> bool:
        """``wait_settled`` of the current handle, carried over a switch."""
        return self._follow(lambda h, t: h.wait_settled(partition, project_sha256, offset, t), timeout)

    def project_changes(self, project_sha256: bytes) -> int:
        """The current handle's change count for the project, above every count of an earlier handle."""
        with self._cond:
            handle, epoch = self._current, self._epoch
        return epoch * EPOCH_UNIT + handle.project_changes(project_sha256)

    def wait_project_changed(self, project_sha256: bytes, seen: int, timeout: float) -> bool:
        """Wait until ``project_changes`` exceeds ``seen``; a switch counts as a change (readers read again)."""

        def changed(handle: H, left: float, epoch: int) -> bool:
            base = epoch * EPOCH_UNIT
            if base + handle.project_changes(project_sha256) > seen:
                return True
            return handle.wait_project_changed(project_sha256, seen - base, left)

        def wait(handle: H, left: float) -> bool:
            with self._cond:
                epoch = self._epoch if self._current is handle else -1
            if epoch < 0:
                return True  # switched between the two looks: the count moved
            return changed(handle, left, epoch)

        return self._follow(wait, timeout)
