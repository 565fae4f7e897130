"""The projector of one ``serve --group`` member: only the partitions the group gives it.

``GroupProjector`` is ``Projector`` with a ``GroupConsumer`` in place of the partition feed. It joins
the group (``throughline.log.group``), and for every partition the group assigns it fetches from the
offset its own DuckDB file committed (0 for a partition it never held) and applies each poll as one
transaction, exactly as the whole-topic projector does: the applied offsets live in the same
transaction as the rows, so a crash at any instant loses and duplicates nothing, and a partition lost
and regained later resumes where the file stopped. A partition it loses keeps its rows; the file's
applied offset for it simply stops moving (the read side, ``throughline.serve.group``, forwards its
reads to a holder instead of answering them from a stale file).

Differences from ``Projector.run``, and why:

- no fetch worker: the group protocol advances only inside the caller's ``poll``, so the consumer must
  be polled on this thread (a worker process would be a second group member). One core per member;
  a member's share of the topic is what scales out;
- the same log checks (rewound, truncated, another topic id, a changed partition count) before the
  first poll and every ``check_interval`` seconds, over every partition: a member that does not hold a
  partition may hold it again, and its file must still be of this log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from throughline.log import KafkaLog, LogError
from throughline.log.group import GroupConsumer, GroupView
from throughline.projector.feed.poller import prepare_poll
from throughline.projector.member_boot import CutFetcher, LogFacts, boot_partition, wants_snapshot
from throughline.projector.periodic_check import PeriodicCheck
from throughline.projector.prepare import PreparedBatch
from throughline.projector.runner import Progress, Projector, RunSummary, Tally

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """Which group a member joins and what it tells the others (``serve --group/--advertise/--copies``)."""

    group: str
    url: str
    copies: int | None = None
    session_timeout_ms: int | None = None  # None: ``throughline.log.group.SESSION_TIMEOUT_MS``
    peer_bootstrap: bool = True  # False: a gained partition is caught up from the log, never from a peer


class GroupProjector(Projector):
    """Projects the partitions a consumer group assigns this member into its own ``DuckProjection``."""

    _role = "member"

    def run_group(
        self,
        spec: GroupSpec,
        *,
        stop: threading.Event,
        on_change: Callable[[GroupView], None] | None = None,
        on_leave: Callable[[], None] | None = None,
        progress: Progress | None = None,
        peer_cuts: CutFetcher | None = None,
    ) -> RunSummary:
        """Join ``spec.group`` and apply what the group assigns until ``stop`` is set.

        ``on_change(view)`` hears every generation (on kafka-python's IO thread, inside a poll);
        ``on_leave()`` hears that the member holds nothing any more: dropped from the group, or this run
        ending (for whatever reason). ``peer_cuts``: how to fetch a peer's projection snapshot; with it (and
        ``spec.peer_bootstrap``), a gained partition this file holds nothing of (or is
        ``member_boot.FAR_BEHIND`` behind on) is loaded from a holder's snapshot first (``member_boot``).
        Raises what ``Projector.run`` raises; on return the member has left the group (the others rebalance).
        """
        started = time.monotonic()
        o = self._options
        info = self._describe()  # a topic that is not there ends the run before it began
        log_view: KafkaLog | None = None
        consumer: GroupConsumer | None = None
        tally = Tally(self._projection, progress, None, self._projection.applied_offsets(), started)
        try:
            info, log_view, _ = self._open_checked(info)
            extra: dict[str, Any] = {}
            if spec.session_timeout_ms is not None:
                extra["session_timeout_ms"] = spec.session_timeout_ms
                extra["heartbeat_interval_ms"] = max(100, spec.session_timeout_ms // 6)
            consumer = GroupConsumer(
                self._servers,
                self._topic,
                group=spec.group,
                url=spec.url,
                copies=spec.copies,
                stored=self._stored,
                start_offset=lambda p: self._projection.applied_offsets().get(p, 0),
                on_change=on_change,
                on_lost=on_leave,
                kafka_config=self._kafka_config,
                **o.fetching(),
                **extra,
            )
            log.info(
                "member %s of group %s on topic %s (%d partitions)", spec.url, spec.group, self._topic, info.partitions
            )
            partitions = info.partitions
            checked = log_view
            self._boot = None
            if peer_cuts is not None and spec.peer_bootstrap:
                facts = LogFacts(self._topic, info.topic_id, info.partitions)
                self._boot = (peer_cuts, facts, log_view, spec.url.rstrip("/"))
            self._seen_held: frozenset[int] = frozenset()
            with PeriodicCheck(lambda: self._check_running(checked), o.check_interval) as check:
                while not stop.is_set():
                    try:
                        check.raise_pending()
                        batches = self._fetch(consumer, partitions)
                    except LogError as exc:
                        self._explain(log_view, exc, stop)
                        continue
                    if batches:
                        tally.apply(self._topic, batches)
        finally:
            if on_leave is not None:
                on_leave()  # before leaving: from now on this member's file may fall behind on everything
            if consumer is not None:
                consumer.close()
            if log_view is not None:
                log_view.close()
        return self._summary(tally, None, False, started, info)

    _boot: tuple[CutFetcher, LogFacts, KafkaLog, str] | None = None
    _seen_held: frozenset[int] = frozenset()

    def _boot_gained(self, consumer: GroupConsumer, gained: frozenset[int], polled: dict[int, list[Any]]) -> None:
        """Load each gained partition the file holds nothing of, or is far behind on, from a holder's
        snapshot (``member_boot``);
        a loaded one's polled records (fetched from 0) are dropped and it is fetched from the snapshot's
        offset. On this thread, the only writer, before anything of the partition is applied."""
        assert self._boot is not None
        fetch, facts, log_view, own = self._boot
        view = consumer.view
        if view is None or view.owner_map is None:
            return
        applied = self._projection.applied_offsets()
        for p in sorted(gained):
            try:
                end = log_view.end_offset(p)
            except LogError as exc:
                log.warning("member bootstrap of partition %d: no end offset (%s): catching up from the log", p, exc)
                continue
            if not wants_snapshot(applied.get(p, 0), end):
                continue
            # A partition that moved here is named by no other member in this generation: every member is
            # asked, this generation's holders first (one that held it before has its rows).
            named = [*view.owner_map.urls(p), *(m.url for m in view.owner_map.members)]
            holders = list(dict.fromkeys(u.rstrip("/") for u in named if u.rstrip("/") != own))
            offset = boot_partition(self._projection, p, holders, fetch, facts, end, applied.get(p, 0))
            if offset is not None:
                polled.pop(p, None)
                try:
                    consumer.seek(p, offset)
                except LogError as exc:  # taken away meanwhile: regained, it is sought at the loaded offset
                    log.warning("member bootstrap of partition %d: cannot seek to %d (%s)", p, offset, exc)

    def _stored(self) -> list[int]:
        """The partitions this member's file has applied anything of (the assignor prefers them)."""
        return [p for p, offset in self._projection.applied_offsets().items() if offset > 0]

    def _fetch(self, consumer: GroupConsumer, partitions: int) -> list[PreparedBatch]:
        """One poll, prepared; a held partition's batch ends at the consumer's position (``prepare_poll``,
        as ``Fetcher``).

        Everything polled is applied, held or not: a position always starts at the file's applied
        offset (a gained partition is sought there), so the records run on from what the file has.
        """
        o = self._options
        polled = consumer.poll(o.poll_timeout, o.max_poll_records)
        held = consumer.assigned
        gained, self._seen_held = held - self._seen_held, held
        if gained and self._boot is not None:
            self._boot_gained(consumer, gained, polled)
        applied = self._projection.applied_offsets()
        return prepare_poll(
            polled,
            sorted(set(polled) | held),
            topic_partitions=partitions,
            position=lambda p: consumer.position(p) if p in held else None,
            next_offset=lambda p: applied.get(p, 0),
        )
