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
  partition may hold it again, and its file must still be of this log;
- a gained partition the file holds nothing of (or is far behind on) is paused and loaded from a peer's
  snapshot, downloaded off this thread (``member_boot.MemberBoots``) while this thread keeps polling and
  applying the member's other partitions: polls keep within the group's ``max_poll_interval_ms``.
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
from throughline.projector.member_boot import CutFetcher, LogFacts, MemberBoots
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
    max_poll_interval_ms: int | None = None  # None: ``throughline.log.group.MAX_POLL_INTERVAL_MS``
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
        ``member_boot.FAR_BEHIND`` behind on) is paused and loaded from a holder's snapshot, downloaded on a
        worker thread (``member_boot``), before anything of it is applied. Raises what ``Projector.run`` raises; on return the member has left the
        group (the others rebalance) and every download under way is cancelled.
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
            if spec.max_poll_interval_ms is not None:
                extra["max_poll_interval_ms"] = spec.max_poll_interval_ms
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
            self._boots = None
            if peer_cuts is not None and spec.peer_bootstrap:
                facts = LogFacts(self._topic, info.topic_id, info.partitions)
                self._boots = MemberBoots(self._projection, peer_cuts, facts, checked.end_offset, spec.url)
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
            if self._boots is not None:
                self._boots.close()
            if on_leave is not None:
                on_leave()  # before leaving: from now on this member's file may fall behind on everything
            if consumer is not None:
                consumer.close()
            if log_view is not None:
                log_view.close()
        return self._summary(tally, None, False, started, info)

    _boots: MemberBoots | None = None
    _seen_held: frozenset[int] = frozenset()

    def _stored(self) -> list[int]:
        """The partitions this member's file has applied anything of (the assignor prefers them)."""
        return [p for p, offset in self._projection.applied_offsets().items() if offset > 0]

    def _fetch(self, consumer: GroupConsumer, partitions: int) -> list[PreparedBatch]:
        """One poll, prepared; a held partition's batch ends at the consumer's position (``prepare_poll``,
        as ``Fetcher``).

        Everything polled is applied, held or not, except a booting partition's records
        (``MemberBoots.booting``), and nothing at all while a snapshot is being loaded (``MemberBoots.step``
        says so; the poll loop runs on, so the member stays in its group however long the load takes): a
        position always starts at the file's applied offset (a gained partition is sought there, a booted
        one at the loaded offset, every other one again after a load), so the records run on from what the
        file has.
        """
        o = self._options
        boots = self._boots
        wait = o.poll_timeout if boots is None else boots.poll_wait(o.poll_timeout)
        polled = consumer.poll(wait, o.max_poll_records)
        held = consumer.assigned
        gained, self._seen_held = held - self._seen_held, held
        if boots is not None:
            # Nothing of a partition booting at any moment of this turn is applied: it was paused, or it
            # was fetched from the file's offset before the load moved it (the next poll fetches it from
            # the snapshot's offset).
            skip = boots.booting
            if gained:
                view = consumer.view
                boots.gained(consumer, gained, None if view is None else view.owner_map)
            skip |= boots.booting
            if boots.step(consumer):
                return []  # a snapshot's load has the file: nothing applied, every position sought back
            for p in skip | boots.booting:
                polled.pop(p, None)
            held = held - skip - boots.booting
        applied = self._projection.applied_offsets()
        return prepare_poll(
            polled,
            sorted(set(polled) | held),
            topic_partitions=partitions,
            position=lambda p: consumer.position(p) if p in held else None,
            next_offset=lambda p: applied.get(p, 0),
        )
