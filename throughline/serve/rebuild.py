"""Rebuilding ``serve``'s projection without downtime (``serve --rebuild``, ``POST /v1/admin/rebuild``).

The topic is replayed into a new file beside the live one (``throughline.projector.rebuild_files``) by a
projector in a child process at a lower CPU priority (``throughline.projector.rebuild_replay``: no GIL
or core taken from the reads), while the live file keeps answering every read and its projector keeps
following the log. Once the new file is within ``close_enough`` records (or ``close_lag`` seconds of the
log) of the live one, the switch (docs/design.md, "Rebuilding without downtime"):

1. the replay stops (its file committed and closed), the new file is opened here and a live run starts
   over it beside the live projector (``standby``: the live run's settings, its fetch worker started
   ahead, counting nothing into ``/metrics`` yet, and staging nothing: nobody reads it, so it commits
   what it catches up as it comes); the rebuild waits until it fetches (its loop began, its fetch
   worker delivered) and follows the log as closely as the live one (it reached what the live file's
   readers saw ``warm_lag`` seconds before); then it stages for readers, and the rebuild waits (bounded
   by ``align_timeout``) for an instant when it has made readable all the live file's readers see;
2. the live projector pauses (``PausableProjector.pause``): its gate closes (``StageGate``), so the
   offsets the live file's readers see stop at ``A`` at once, whether or not its loop is waiting for a
   fetch (it commits what it staged, then closes its own clients, beside what follows);
3. the new file's run goes on until it made at least ``A`` readable on every partition, staged or
   committed (bounded by ``switch_timeout``; past it the live projector resumes and the rebuild tries
   again later); usually it is there already;
4. the marker is written: from here a crash restarts on the new file (its projector catches its
   commits up from the log, as after any crash of ``serve``);
5. reads switch to it (``SwitchableProjection.switch``): reads in flight finish on the old handle, new
   ones go to the new, waits carry over;
6. the waits still on the old handle go on on the new one (``retire``), and the live projector resumes
   with the new file's run, already going on (``PausableProjector.resume`` adopts it: nothing starts
   inside the pause); then (outside the pause) that run counts into ``/metrics`` once its commits
   passed ``A``, the old handle closes once its reads are done and the old run left it (without a
   checkpoint: its file goes next). The new file is not checkpointed here (reads wait for a checkpoint):
   its commits since the replay's close reach the disk at its next one, as every commit of ``serve``.

One owner for each piece of state: the rebuild's phase and figures are this object's (published as a
frozen ``RebuildStatus``), the current handle is the ``SwitchableProjection``'s, the live projector's
projection, pause and run are the ``PausableProjector``'s; the threads hand each other only handles,
runs and immutable values.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from throughline.projector.rebuild_files import RebuildFiles
from throughline.serve.exceptions import RebuildRefusedError
from throughline.serve.metrics import ServeMetrics
from throughline.serve.pausable import RUN_STOP_TIMEOUT, PausableProjector, RunThread
from throughline.serve.switchable import SwitchableHandle, SwitchableProjection

__all__ = [
    "Ahead",
    "PausableProjector",
    "Rebuild",
    "RebuildSettings",
    "RebuildStatus",
    "RebuiltHandle",
    "Replay",
    "SpareAhead",
    "rebuild_metrics",
]

_log = logging.getLogger("throughline.serve.rebuild")


class RebuiltHandle(SwitchableHandle, Protocol):
    """A projection a rebuild writes and switches to (``DuckProjection``)."""

    def checkpoint(self) -> None:
        """Write everything committed into the file, synced to the disk."""
        ...


H = TypeVar("H", bound=RebuiltHandle)


class Ahead(Protocol):
    """What the new file's live run needs that can start before the file is open (``spawn_worker_ahead``:
    its fetch worker process, whose imports would otherwise lie between the replay's end and that run's
    first poll: a few hundred more records for it to fold in ``serve``'s process)."""

    def stop(self) -> object:
        """Stop it (the run never took it over)."""
        ...


class SpareAhead:
    """An ``Ahead`` started long before it is needed (``prepare``: as ``serve`` starts) and handed to the
    first rebuild that asks; later ones start their own. A fetch worker's start (~0.3 s of a core for its
    imports, measured) made with the rebuild's POST takes that core from the reads of the moment; made
    with ``serve``'s start, it costs one idle process (blocked on its spec) while none is asked for.

    Threading: ``prepare``, ``__call__`` and ``close`` from any thread (one lock); the spare is this
    object's until it is handed over, the caller's from then on."""

    def __init__(self, start: Callable[[], Ahead]) -> None:
        self._start = start
        self._lock = threading.Lock()
        self._spare: Ahead | None = None
        self._closed = False

    def prepare(self) -> None:
        """Start the spare now (once)."""
        with self._lock:
            if self._spare is None and not self._closed:
                self._spare = self._start()

    def __call__(self) -> Ahead:
        """The spare, or a new one when it was handed over already."""
        with self._lock:
            spare, self._spare = self._spare, None
        return spare if spare is not None else self._start()

    def close(self) -> None:
        """Stop the spare nobody asked for (``serve`` stopping); none starts after."""
        with self._lock:
            spare, self._spare, self._closed = self._spare, None, True
        if spare is not None:
            spare.stop()


class Replay(Protocol):
    """A rebuild's replay of the topic into the new file, which it holds until it stopped
    (``throughline.projector.rebuild_replay.ReplayProcess``: a child process at a lower CPU priority).

    Started once and stopped once, from the rebuild's thread; ``offsets`` from any thread."""

    def start(self) -> None:
        """Start folding the topic into the file, from the file's applied offsets."""
        ...

    def offsets(self) -> Mapping[int, int]:
        """The file's applied offsets, as last reported (they lag its commits by a report's interval)."""
        ...

    def raise_failure(self) -> None:
        """Raise why it ended, if it failed or ended before it was stopped."""
        ...

    def stop(self, timeout: float) -> None:
        """Stop it (its batch in flight committed, the file closed and let go) and wait, at most ``timeout``."""
        ...


#: Checks of the new file's progress while it replays (one every ``poll`` seconds: days of replay).
MAX_CHECKS = 100_000_000
#: How often the pause looks at the new file's commits (it lasts a commit or two: milliseconds count).
PAUSE_CHECK = 0.002


@dataclass(frozen=True, slots=True)
class RebuildSettings:
    """How a rebuild decides to switch."""

    close_enough: int = 200  # records the new file may be behind the live one when its replay hands over
    close_lag: float = 0.15  # or seconds of the log (at a high rate): the new file's live run catches up the rest
    warm_lag: float = 0.05  # seconds of the log the new file's live run may be behind the live one before aligning
    align_timeout: float = 1.0  # bound on waiting for an instant the new file's run is level with the live one
    pause_timeout: float = 60.0  # bound on the live projector's gate closing (a poll being made readable)
    switch_timeout: float = 30.0  # bound on the pause: the new file reaches the live offsets within it; and on warming
    drain_timeout: float = 30.0  # bound on the reads in flight on the old handle after the switch
    attempts: int = 5  # switch attempts before the rebuild gives up (the live file keeps serving)
    poll: float = 0.1  # how often the rebuild looks at the two files' offsets
    progress_interval: float = 10.0  # seconds between progress lines in the log


@dataclass(frozen=True, slots=True)
class RebuildStatus:
    """What ``GET /v1/admin/rebuild`` answers: the rebuild's phase and figures at one instant."""

    phase: str = "idle"  # idle, replaying, switching, switched, failed
    started: float | None = None  # wall-clock seconds
    finished: float | None = None
    live: Mapping[int, int] = field(default_factory=dict)  # the live file's applied offsets
    rebuilt: Mapping[int, int] = field(default_factory=dict)  # the new file's applied offsets
    attempts: int = 0
    paused_seconds: float | None = None  # how long the live projector was paused for the switch
    error: str | None = None

    @property
    def behind(self) -> int:
        """Records the new file is behind the live one (summed over partitions)."""
        return behind(self.live, self.rebuilt)

    def to_json(self) -> dict[str, Any]:
        """The document of ``GET /v1/admin/rebuild``."""
        return {
            "phase": self.phase,
            "started": self.started,
            "finished": self.finished,
            "behind": self.behind,
            "live": {str(p): o for p, o in sorted(self.live.items())},
            "rebuilt": {str(p): o for p, o in sorted(self.rebuilt.items())},
            "attempts": self.attempts,
            "pausedSeconds": self.paused_seconds,
            "error": self.error,
        }


class _Trail:
    """A file's offsets sampled over time, keeping the newest sample at least ``lag`` seconds old: what
    "``lag`` seconds of the log behind it" means, whatever the log's rate. Owned by one thread."""

    def __init__(self, lag: float) -> None:
        self._lag = lag
        self._seen: deque[tuple[float, Mapping[int, int]]] = deque()

    def add(self, now: float, offsets: Mapping[int, int]) -> Mapping[int, int] | None:
        """Add the sample of ``now``; return the offsets of ``lag`` seconds before (``None``: too early)."""
        self._seen.append((now, offsets))
        while len(self._seen) > 1 and self._seen[1][0] <= now - self._lag:
            self._seen.popleft()
        at, past = self._seen[0]
        return past if at <= now - self._lag else None


def behind(target: Mapping[int, int], reached: Mapping[int, int]) -> int:
    """Offsets ``reached`` lacks to reach ``target``, summed over the partitions."""
    return sum(max(0, int(end) - int(reached.get(p, 0))) for p, end in target.items())


class Rebuild(Generic[H]):
    """One service's rebuilds: at most one at a time, and one switch per run of ``serve`` (the switched-to
    file keeps its name until the service stops: ``RebuildFiles``)."""

    def __init__(
        self,
        *,
        files: RebuildFiles,
        reads: SwitchableProjection[H],
        live: PausableProjector[H],
        open_new: Callable[[Any], H],
        replay: Callable[[Path], Replay],
        stopping: threading.Event,
        settings: RebuildSettings | None = None,
        on_status: Callable[[RebuildStatus], None] | None = None,
        start_ahead: Callable[[], Ahead] | None = None,
    ) -> None:
        self._files = files
        self._reads = reads
        self._live = live
        self._open_new = open_new
        self._replay = replay
        self._start_ahead = start_ahead
        self._stopping = stopping
        self._settings = settings or RebuildSettings()
        self._on_status = on_status
        self._lock = threading.Lock()
        self._status = RebuildStatus()
        self._thread: threading.Thread | None = None
        self._marked = False  # the rebuild's thread's own: the marker was written

    def status(self) -> RebuildStatus:
        """The rebuild's phase and figures now (an immutable value)."""
        with self._lock:
            return self._status

    def _publish(self, **changes: Any) -> RebuildStatus:
        with self._lock:
            self._status = replace(self._status, **changes)
            status = self._status
        if self._on_status is not None:
            self._on_status(status)
        return status

    def start(self) -> RebuildStatus:
        """Start a rebuild on a thread of its own; ``RebuildRefusedError`` while one runs or after a switch."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                raise RebuildRefusedError("a rebuild is already running: follow it with GET /v1/admin/rebuild")
            if self._status.phase == "switched":
                raise RebuildRefusedError(
                    "this serve switched to a rebuilt file already; restart it (the file moves to --db) to rebuild again"
                )
            if self._stopping.is_set():
                raise RebuildRefusedError("serve is stopping")
            self._status = RebuildStatus(phase="replaying", started=time.time())
            self._thread = threading.Thread(target=self._main, name="throughline-rebuild", daemon=True)
            self._thread.start()
        _log.warning("rebuild: replaying the topic into %s while %s serves", self._files.rebuilt, self._files.db)
        return self.status()

    def join(self, timeout: float) -> bool:
        """Wait (bounded) for a rebuild in progress to end; ``True`` when none runs."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()

    # ------------------------------------------------------------------ the rebuild's thread

    def _main(self) -> None:
        try:
            self._rebuild()
        except Exception as exc:  # reported in the status and the log; the live file keeps serving
            message = f"{exc.__class__.__name__}: {exc}"
            _log.error("rebuild failed: %s; %s keeps serving", message, self._files.db)
            self._publish(phase="failed", finished=time.time(), error=message)

    def _rebuild(self) -> None:
        self._files.remove_unfinished()
        replay = self._replay(self._files.rebuilt)
        ahead: Ahead | None = None
        new: H | None = None
        runner: RunThread | None = None
        self._marked = False
        switched = False
        try:
            replay.start()
            ahead = self._start_ahead() if self._start_ahead is not None else None
            self._publish(attempts=1)
            if not self._catch_up(replay.offsets, replay.raise_failure):
                raise RebuildRefusedError("serve stopped before the rebuild caught up")
            new = self._hand_over(replay)
            runner, ahead = self._live.standby(new, self._stopping, ahead), None
            for attempt in range(1, self._settings.attempts + 1):
                self._publish(attempts=attempt)
                if attempt > 1 and not self._catch_up(new.applied_offsets, runner.raise_failure):
                    raise RebuildRefusedError("serve stopped before the rebuild caught up")
                if not self._warm(new, runner):
                    raise RebuildRefusedError("serve stopped before the rebuild caught up")
                if self._switch(new, runner):
                    switched = True
                    return
            raise RebuildRefusedError(
                f"the rebuilt file did not reach the live one within {self._settings.switch_timeout:g}s of a pause "
                f"in {self._settings.attempts} attempts"
            )
        finally:
            if not switched and not self._marked:  # past the marker the new file is the projection: kept
                try:
                    if ahead is not None:
                        ahead.stop()
                    if runner is not None:
                        runner.stop()
                    replay.stop(RUN_STOP_TIMEOUT)  # the file is removed next: the child must have let it go
                finally:
                    if new is not None:
                        new.close()
                    self._files.remove_unfinished()
                    self._live.resume()

    def _offsets(self, rebuilt_offsets: Callable[[], Mapping[int, int]]) -> tuple[dict[int, int], dict[int, int]]:
        live = dict(self._live.projection.applied_offsets())
        rebuilt = dict(rebuilt_offsets())
        self._publish(live=live, rebuilt=rebuilt)
        return live, rebuilt

    def _catch_up(self, rebuilt_offsets: Callable[[], Mapping[int, int]], raise_failure: Callable[[], None]) -> bool:
        """Wait until the new file (its applied offsets: ``rebuilt_offsets``) is within ``close_enough``
        records of the live one, or reached what the live one had ``close_lag`` seconds before (at a rate
        where a few records are a few milliseconds); ``raise_failure`` raises why what writes it ended."""
        s = self._settings
        last_line = time.monotonic()
        trail = _Trail(s.close_lag)
        self._publish(phase="replaying")
        for _ in range(MAX_CHECKS):
            raise_failure()
            now = time.monotonic()
            live, rebuilt = self._offsets(rebuilt_offsets)
            past = trail.add(now, live)
            lacking = behind(live, rebuilt)
            if lacking <= s.close_enough or (past is not None and behind(past, rebuilt) == 0):
                return True
            if now - last_line >= s.progress_interval:
                last_line = now
                _log.warning("rebuild: %d records behind the live file (rebuilt %s)", lacking, rebuilt)
            if self._stopping.wait(s.poll):
                return False
        return False

    def _hand_over(self, replay: Replay) -> H:
        """Stop the replay (its batch in flight committed, the file closed) and open the new file here, for
        its live run to start on (``standby``), outside any pause: its start (a fetch worker process, the
        topic's checks) is what used to hold the pause and every read waiting on it."""
        replay.stop(RUN_STOP_TIMEOUT)
        replay.raise_failure()
        new = self._open_new(self._files.rebuilt)
        try:
            # Nothing of the replay's WAL into the file later, inside the pause: a checkpoint then would
            # hold the new file's reads (hundreds of milliseconds). Its close checkpointed it already.
            new.checkpoint()
        except BaseException:
            new.close()
            raise
        return new

    def _warm(self, new: H, runner: RunThread) -> bool:
        """Wait (bounded by ``switch_timeout``: past it the pause is tried anyway) until the new file's live
        run follows the log: its loop began, its fetch worker delivered a poll (its start takes 0.3-0.8 s
        after the loop began) unless there was nothing to deliver, and it reached what the live file's
        readers saw ``warm_lag`` seconds before (staged included, on both files): the pause then waits
        for about that much of the log, whatever its rate."""
        s = self._settings
        start = dict(new.readable_offsets())
        trail = _Trail(s.warm_lag)  # the live file's readable offsets
        deadline = time.monotonic() + s.switch_timeout
        for _ in range(MAX_CHECKS):
            runner.raise_failure()
            now = time.monotonic()
            latest = self._live.projection.readable_offsets()
            target = trail.add(now, latest)
            rebuilt = new.readable_offsets()
            delivered = rebuilt != start or behind(latest, start) == 0
            if runner.events.started.is_set() and delivered and target is not None:
                if behind(target, rebuilt) == 0:
                    return True
            if now >= deadline:
                _log.warning(
                    "rebuild: the new file's live run is %d records behind; pausing anyway",
                    behind(latest, rebuilt),
                )
                return True
            if self._stopping.wait(s.poll / 10):
                return False
        return True

    def _align(self, new: H) -> bool:
        """Wait (bounded by ``align_timeout``) for an instant when the new file's run has made readable all
        that the live file's readers see, so that the pause that follows waits for a poll at most; ``True``
        when one came."""
        deadline = time.monotonic() + self._settings.align_timeout
        for _ in range(MAX_CHECKS):
            # The live file first: the new file's offsets, read after, only grew since that instant.
            if behind(self._live.projection.readable_offsets(), new.readable_offsets()) == 0:
                return True
            if time.monotonic() >= deadline or self._stopping.wait(PAUSE_CHECK):
                return False
        return False

    def _switch(self, new: H, runner: RunThread) -> bool:
        """Pause the live projector, let the new file's run reach what its readers saw, switch reads and hand
        that run over as the live projector; ``False``: not in time (the live projector resumed, the run
        goes on)."""
        s = self._settings
        self._publish(phase="switching")
        # Caught up (each poll committed as it came, folded once): from here its polls are staged as the
        # live run's are, so that it can be level with what the live file's readers see.
        runner.events.serving.set()
        aligned = self._align(new)
        paused_at = time.monotonic()
        if not self._live.pause(s.pause_timeout):
            self._live.resume()
            raise RebuildRefusedError(f"the live projector did not pause within {s.pause_timeout:g}s")
        stopped_at = time.monotonic()
        # What the old file's readers saw (its run may still be committing it): final now. The new file
        # must make as much readable, staged or committed, as every read of serve may answer from.
        target = dict(self._live.projection.readable_offsets())
        deadline = time.monotonic() + s.switch_timeout
        for _ in range(MAX_CHECKS):
            runner.raise_failure()
            if behind(target, new.readable_offsets()) == 0:
                break
            if time.monotonic() >= deadline or self._stopping.wait(PAUSE_CHECK):
                self._live.resume()
                _log.warning("rebuild: the new file did not reach the live one during the pause; trying again")
                return False
        reached_at = time.monotonic()
        # A crash from here starts on the new file, whose commits may be behind what it staged for readers,
        # as any file of serve after a crash: its projector catches up from the log.
        self._files.mark_switched()
        self._marked = True
        marked_at = time.monotonic()
        old, drained = self._reads.switch(new, s.drain_timeout)
        old.retire()  # the waits parked on it go on on the new file now, not after its last commit
        self._live.resume(new, runner)
        resumed_at = time.monotonic()
        paused = resumed_at - paused_at
        steps = (stopped_at - paused_at, reached_at - stopped_at, marked_at - reached_at, resumed_at - marked_at)
        self._count_from(new, target, runner)
        try:
            if not drained:
                _log.error("rebuild: reads on the old file still in flight after %gs; closing it", s.drain_timeout)
            if not self._live.wait_left(RUN_STOP_TIMEOUT):
                raise RebuildRefusedError(f"the old live run did not leave its file within {RUN_STOP_TIMEOUT:g}s")
            old.discard()  # no checkpoint of its WAL into a file removed next
            self._files.remove_old()
        except Exception as exc:  # the next start removes the old file (the marker names the new one)
            _log.error("rebuild: after the switch: %s (the next start finishes it)", exc)
        self._offsets(new.applied_offsets)
        self._publish(phase="switched", finished=time.time(), paused_seconds=round(paused, 3))
        _log.warning(
            "rebuild: reads switched to %s (live projector paused %.3fs%s: its run stopped making the log readable "
            "in %.3fs, the new file reached its offsets %.3fs later, the marker %.3fs, the switch %.3fs); it "
            "moves to %s when serve stops",
            self._files.rebuilt,
            paused,
            "" if aligned else f" after {s.align_timeout:g}s without an instant level with it",
            *steps,
            self._files.db,
        )
        return True

    def _count_from(self, new: H, target: Mapping[int, int], runner: RunThread) -> None:
        """Let the new file's run count into ``/metrics`` once its commits passed what the old run counted
        (``target``: it committed all it staged); bounded by ``switch_timeout``."""
        deadline = time.monotonic() + self._settings.switch_timeout
        for _ in range(MAX_CHECKS):
            if behind(target, new.applied_offsets()) == 0 or time.monotonic() >= deadline:
                break
            if self._stopping.wait(PAUSE_CHECK * 5):
                break
        runner.events.counted.set()


def rebuild_metrics(metrics: ServeMetrics) -> Callable[[RebuildStatus], None]:
    """A ``Rebuild``'s ``on_status`` that shows its phase and progress in ``/metrics``."""
    phase = metrics.registry.gauge(
        "throughline_rebuild_phase",
        "1 for the phase the projection's rebuild is in (replaying, switching, ...)",
        ("phase",),
    )
    lacking = metrics.registry.gauge(
        "throughline_rebuild_behind_records", "Records the file being rebuilt is behind the live one"
    )
    paused = metrics.registry.gauge(
        "throughline_rebuild_paused_seconds", "How long the live projector was paused for the last switch of files"
    )

    def on_status(status: RebuildStatus) -> None:
        phase.replace([({"phase": status.phase}, 1.0)])
        lacking.set(status.behind)
        if status.paused_seconds is not None:
            paused.set(status.paused_seconds)

    return on_status
