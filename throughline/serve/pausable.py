"""The live projector of ``serve`` as a rebuild switches it from one file to another (``PausableProjector``),
and one projector run on a thread of its own (``RunThread``: a rebuild's replay, the standby run that takes
over as the live projector).

A switch used to stop the live projector and start a new one on the new file inside the pause: a new fetch
worker process, the topic's checks and the first fetch (0.3-0.8 s), while every first page and long-poll of
that moment waited (docs/benchmarks.md, "9. Reads during a rebuild's switch"). Now the rebuild starts the
new file's live run before the pause (``standby``), and the switch hands that running run over
(``resume(projection, standby)``): nothing starts inside the pause.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from throughline.projector.pipeline import StageGate
from throughline.serve.exceptions import RebuildRefusedError

_log = logging.getLogger("throughline.serve.rebuild")

H = TypeVar("H")
H_contra = TypeVar("H_contra", contravariant=True)

#: Pause cycles of the live projector in one service (each a rebuild's switch attempt).
MAX_RUNS = 1_000_000
#: Bound on a run committing its batch in flight and returning once asked to stop.
RUN_STOP_TIMEOUT = 120.0
_WATCH = 0.2  # how soon a paused or stopping run notices the service's stop


@dataclass(frozen=True, eq=False)
class RunEvents:
    """How one projector run is driven and how it says where it is.

    ``stop`` ends it; ``commit`` (set before ``stop``) has it commit what it staged for readers before it
    returns; it counts what it applies into ``/metrics`` while ``counted`` is set (a run started beside
    the live one, over a rebuilt file, counts only once it took over); once ``gate`` is closed it makes
    nothing more readable (the offsets its readers saw are final, though it may still commit what it
    staged; closed after ``stop``: it drops what it is handed); it sets ``started`` once it checked the
    log and opened its feed, and ``released`` once it touches its projection no more (what is left is
    closing its own fetch worker and log clients). ``ahead``: what was started ahead for the run (a fetch
    worker process, ``spawn_worker_ahead``), which the run takes over. ``serving`` is set while readers
    read its projection (its polls are staged for them); clear, it commits each poll as it comes.
    """

    stop: threading.Event = field(default_factory=threading.Event)
    commit: threading.Event = field(default_factory=threading.Event)
    counted: threading.Event = field(default_factory=threading.Event)
    gate: StageGate = field(default_factory=StageGate)
    started: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    serving: threading.Event = field(default_factory=lambda: _set(threading.Event()))
    ahead: Any = None

    def ended(self) -> None:
        """The run returned (or never ran): it makes nothing readable any more, and leaves its projection."""
        self.gate.close(RUN_STOP_TIMEOUT)
        self.released.set()

    @classmethod
    def counting(cls, stop: threading.Event | None = None) -> RunEvents:
        """The events of a run that counts into ``/metrics`` from its start (``stop``: the one given)."""
        events = cls(stop=stop or threading.Event())
        events.counted.set()
        return events


def _set(event: threading.Event) -> threading.Event:
    event.set()
    return event


class LiveRun(Protocol[H_contra]):
    """One run of the live projector over ``projection`` driven by ``events`` (``projector_runs.live_run``)."""

    def __call__(self, projection: H_contra, events: RunEvents) -> object:
        """Run until ``events.stop``."""
        ...


class RunThread:
    """One projector run on a thread of its own, remembering how it ended.

    ``run(events)`` receives this object's ``events`` (``RunEvents``); ``also_stop`` (the service's stop)
    ends it too, so a run nobody took over never outlives the service.
    """

    def __init__(
        self,
        run: Callable[[RunEvents], object],
        *,
        name: str,
        also_stop: threading.Event | None = None,
        events: RunEvents | None = None,
    ) -> None:
        self._run = run
        self.events = events or RunEvents()
        self._also_stop = also_stop
        self._error: BaseException | None = None
        self._unasked = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self) -> None:
        """Start the run."""
        self._thread.start()

    def _main(self) -> None:
        events = self.events
        watcher: threading.Thread | None = None
        if self._also_stop is not None:
            watcher = threading.Thread(
                target=relay, args=(self._also_stop, events.stop), name="throughline-run-stop", daemon=True
            )
            watcher.start()
        try:
            self._run(events)
        except BaseException as exc:  # handed to whoever waits for the run (``raise_failure``, ``wait``)
            self._error = exc
        else:
            self._unasked = not events.stop.is_set()
        finally:
            events.ended()
            events.stop.set()  # ends the watcher
            if watcher is not None:
                watcher.join()

    @property
    def ended(self) -> bool:
        """Whether the run returned (or failed)."""
        return self._thread.ident is not None and not self._thread.is_alive()

    def raise_failure(self) -> None:
        """Raise why the run ended, if it ended without being asked to."""
        if self._error is not None:
            raise self._error
        if self._unasked:
            raise RebuildRefusedError("the rebuild's projector stopped without being asked")

    def wait(self) -> None:
        """Wait for the run to end (it lasts as long as a live projector's run does) and raise its error."""
        self._thread.join()
        if self._error is not None:
            raise self._error

    def stop(self, timeout: float = RUN_STOP_TIMEOUT) -> None:
        """Stop the run (it commits its batch in flight) and wait for it (bounded)."""
        self.events.stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise RebuildRefusedError(f"a projector run of the rebuild did not stop within {timeout:g}s")


class PausableProjector(Generic[H]):
    """The live projector loop of ``serve`` (a ``ProjectorThread`` loop) over a projection that a switch
    replaces: ``pause`` ends the run in progress (what it staged is committed) and holds the next one
    until ``resume`` names the projection it goes on with, and, optionally, the run already going on
    over it (``standby``), which the loop then follows instead of starting one.

    A pause is over once the run's gate closed (``RunEvents.gate``: it makes nothing more readable, so
    what its readers saw is final: a poll staged at most, 1-2 ms), not once its loop noticed (only when
    its poll returns, up to a fetch's wait) nor once it returned: committing what it staged, then closing
    its fetch worker and log clients (tens to hundreds of milliseconds on a busy machine) go on beside the
    switch, which closes the old file only once the run released it (``wait_left``).

    One owner: the projection, whether the loop is paused, the run in progress (its events) and a run
    handed over but not picked up yet are this object's, changed under its lock.
    """

    def __init__(self, run: LiveRun[H], projection: H) -> None:
        self._run = run
        self._cond = threading.Condition()
        self._projection = projection
        self._paused = False
        self._pauses = 0  # pauses so far: a run that ends after one was ended by it
        self._events: RunEvents | None = None  # the run in progress (or handed over), if any
        self._handed: RunThread | None = None  # resumed with, not picked up by the loop yet
        self._left: RunEvents | None = None  # the run the last pause ended
        self._ended = False  # the loop returned on the service's stop: nothing picks up a run any more

    @property
    def projection(self) -> H:
        """The projection the live projector writes."""
        with self._cond:
            return self._projection

    def standby(self, projection: H, also_stop: threading.Event, ahead: Any = None) -> RunThread:
        """Start a live run over ``projection`` beside the run in progress, on a thread of its own (so that
        it is warm when a switch hands it over: ``resume(projection, run)``); it counts nothing into
        ``/metrics`` until its ``events.counted`` is set, stages nothing for readers until its
        ``events.serving`` is set, and takes over ``ahead`` (``RunEvents.ahead``). The caller stops it
        unless it hands it over."""
        runner = RunThread(
            lambda events: self._run(projection, events),
            name="throughline-standby-projector",
            also_stop=also_stop,
            events=RunEvents(ahead=ahead, serving=threading.Event()),
        )
        runner.start()
        return runner

    def __call__(self, stop: threading.Event) -> object:
        for _ in range(MAX_RUNS):
            with self._cond:
                while self._paused and not stop.is_set():
                    self._cond.wait(_WATCH)
                handed, self._handed = self._handed, None
                if stop.is_set():
                    self._ended = True
                elif handed is None:
                    self._events = RunEvents.counting()
                events, projection, pauses = self._events, self._projection, self._pauses
            if stop.is_set():
                if handed is not None:
                    self._finish(handed.events, handed.stop)
                return None
            assert events is not None
            watcher = threading.Thread(target=relay, args=(stop, events.stop), name="throughline-pause", daemon=True)
            watcher.start()
            try:
                if handed is None:
                    self._run(projection, events)
                else:
                    handed.wait()  # the run handed over is this loop's run from here
            except Exception as exc:
                with self._cond:
                    superseded = self._handed is not None and self._pauses != pauses
                if not superseded:
                    raise
                # Its last commit was to the file a switch just left (removed next): the run handed over
                # is the live projector, and this failure is not the service's.
                _log.warning("the live run over the file reads left failed as it ended: %s", exc)
            finally:
                events.stop.set()
                self._finish(events, watcher.join)
            with self._cond:
                if self._pauses == pauses and self._handed is None:
                    self._ended = stop.is_set()
                    return None  # stopped by the service (or by itself: the ProjectorThread says so)
        return None

    def _finish(self, events: RunEvents, wait: Callable[[], object]) -> None:
        """``wait`` for the run of ``events`` to be over, then say so (to a ``pause`` waiting for it)."""
        try:
            wait()
        finally:
            events.ended()
            with self._cond:
                if self._events is events:
                    self._events = None
                self._cond.notify_all()

    def pause(self, timeout: float) -> bool:
        """End the run in progress (what it staged is committed) and hold the next; ``True`` once its gate
        closed within ``timeout``: the offsets its readers saw are final (it may still be committing them)."""
        with self._cond:
            self._paused = True
            self._pauses += 1
            events = self._left = self._events
            if events is None:
                return True
            events.commit.set()
            events.stop.set()
        return events.gate.close(timeout)

    def wait_left(self, timeout: float) -> bool:
        """Wait (bounded) until the run the last pause ended touches its projection no more (what it
        staged committed, its writer stopped); ``True`` when it did, or none was running."""
        with self._cond:
            events = self._left
        return events is None or events.released.wait(timeout)

    def resume(self, projection: H | None = None, standby: RunThread | None = None) -> None:
        """Let the live projector run again: on ``projection`` when given (the switched-to file); with
        ``standby``, the run already going on over it (``standby``) is the live projector from now on,
        and nothing new starts."""
        orphan: RunThread | None = None
        with self._cond:
            if projection is not None:
                self._projection = projection
            if standby is not None and self._ended:
                orphan = standby  # the service stopped: nobody would follow it
            elif standby is not None:
                # The run in progress from here (a pause would stop it), though the loop picks it up later.
                self._handed, self._events = standby, standby.events
            self._paused = False
            self._cond.notify_all()
        if orphan is not None:
            orphan.stop()


def relay(stop: threading.Event, run_stop: threading.Event) -> None:
    """Set ``run_stop`` when ``stop`` is set; ends with the run (bounded by the run's life)."""
    while not run_stop.wait(_WATCH):
        if stop.is_set():
            run_stop.set()
