"""The projector runs ``serve`` starts: the live one (``live_run``, alone or as a group member through
``projector_loop``; a rebuild's new file gets one too before its switch), a rebuild's replay
(``rebuild_replay``: a child process), and the progress callback that counts what they apply into ``/metrics``
(``metered_progress``). ``service`` and ``pausable`` own the threads that run them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from throughline.serve.metrics import ServeMetrics
from throughline.serve.pausable import RunEvents

if TYPE_CHECKING:
    from throughline.log import KafkaClientConfig
    from throughline.log.group import GroupView
    from throughline.projector.group_runner import GroupSpec
    from throughline.projector.member_boot import CutFetcher
    from throughline.projector.runner import ProgressUpdate
    from throughline.serve.pausable import LiveRun
    from throughline.serve.rebuild import Replay


def projector_loop(
    projection: Any,
    servers: list[str],
    topic: str,
    metrics: ServeMetrics,
    kafka_config: KafkaClientConfig | None = None,
    *,
    group: GroupSpec | None = None,
    on_change: Callable[[GroupView], None] | None = None,
    on_leave: Callable[[], None] | None = None,
    peer_cuts: CutFetcher | None = None,
) -> Callable[[threading.Event], object]:
    """The projector's consume loop over ``projection``, counting what it applies into ``metrics``
    (with ``group``: only the partitions the group assigns this member, ``GroupProjector``, which loads a
    partition it gains from a peer's snapshot through ``peer_cuts``)."""
    from throughline.projector.group_runner import GroupProjector

    progress = metered_progress(metrics)
    run = live_run(servers, topic, metrics, kafka_config)

    def loop(stop: threading.Event) -> object:
        if group is not None:
            member = GroupProjector(projection, servers, topic, kafka_config=kafka_config)
            return member.run_group(
                group, stop=stop, on_change=on_change, on_leave=on_leave, progress=progress, peer_cuts=peer_cuts
            )
        return run(projection, RunEvents.counting(stop))

    return loop


def live_run(
    servers: list[str], topic: str, metrics: ServeMetrics, kafka_config: KafkaClientConfig | None = None
) -> LiveRun[Any]:
    """One run of the live projector over a projection, driven by its ``RunEvents`` (``PausableProjector``'s
    run): until ``stop``; ``commit`` set, what it staged for readers is committed before it returns; what
    it applies counts into ``/metrics`` while ``counted`` is set (a rebuild's run that becomes the live
    one: until the switch, those records are counted by the live run over the old file); once ``gate``
    closed it makes nothing more readable; ``started`` is set as its loop begins, ``released`` once it
    leaves the projection alone; ``ahead``: its fetch worker, when one was started ahead; while
    ``serving`` is clear it commits each poll as it comes instead of staging it for readers."""
    from throughline.projector.runner import Projector, ProjectorOptions

    progress = metered_progress(metrics)

    def run(projection: Any, events: RunEvents) -> object:
        # Its readers share the projection: each poll is readable as soon as it is folded, before its commit.
        options = ProjectorOptions(stage_reads=True)
        return Projector(projection, servers, topic, options=options, kafka_config=kafka_config).run(
            stop=events.stop,
            progress=_counted_when(events.counted, progress),
            commit_queued=events.commit,
            released=events.released,
            running=events.started,
            gate=events.gate,
            worker=events.ahead,
            staging=events.serving,
        )

    return run


def _counted_when(
    counted: threading.Event, progress: Callable[[ProgressUpdate], None]
) -> Callable[[ProgressUpdate], None]:
    """``progress``, for the updates after ``counted`` was set."""

    def gated(update: ProgressUpdate) -> None:
        if counted.is_set():
            progress(update)

    return gated


def rebuild_replay(
    servers: list[str], topic: str, kafka_config: KafkaClientConfig | None = None, *, sync_commits: bool = False
) -> Callable[[Path], Replay]:
    """The rebuild's replay into its new file: a projector in a child process at a lower CPU priority
    (``ReplayProcess``); nobody reads that file yet, so nothing is staged for readers."""
    from throughline.projector.rebuild_replay import ReplayProcess

    def replay(path: Path) -> Replay:
        return ReplayProcess(path, servers, topic, kafka_config=kafka_config, sync_commits=sync_commits)

    return replay


def metered_progress(metrics: ServeMetrics) -> Callable[[ProgressUpdate], None]:
    """The projector runs' ``progress`` callback that counts what they apply into ``metrics``: the
    record, turn and quarantine counters, and each transaction's duration and records (one callback
    for every run of the service: a run retried after a failure goes on counting)."""

    def progress(update: ProgressUpdate) -> None:
        # From the batch, not the run's totals: a retried run starts its totals again at 0.
        batch = update.batch
        for counter, applied in (
            (metrics.records_applied, batch.records),
            (metrics.turns_applied, batch.appended),
            (metrics.quarantined, batch.quarantined),
        ):
            if applied:
                counter.inc(applied)
        if batch.records:
            metrics.transaction_duration.observe(update.batch_seconds)
            metrics.transaction_records.observe(batch.records)

    return progress
