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

import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from throughline.serve.exceptions import RebuildRefusedError

H = TypeVar("H")
H_contra = TypeVar("H_contra", contravariant=True)

#: Pause cycles of the live projector in one service (each a rebuild's switch attempt).
MAX_RUNS = 1_000_000
#: Bound on a run committing its batch in flight and returning once asked to stop.
RUN_STOP_TIMEOUT = 120.0
_WATCH = 0.2  # how soon a paused or stopping run notices the service's stop


class LiveRun(Protocol[H_contra]):
    """One run of the live projector over ``projection`` until ``stop`` (``projector_runs.live_run``):
    ``commit_queued`` set, what it staged for readers is committed before it returns; ``counted`` given,
    it counts what it applies into ``/metrics`` only once that is set."""

    def __call__(
        self,
        projection: H_contra,
        stop: threading.Event,
        commit_queued: threading.Event,
        counted: threading.Event | None = None,
    ) -> object:
        """Run until ``stop``."""
        ...


class RunThread:
    """One projector run on a thread of its own, remembering how it ended.

    ``run(stop, commit_queued, counted)`` receives this object's three events: ``stop_event`` ends it,
    ``commit`` asks it to commit what it staged for readers first, ``counted`` lets it count into
    ``/metrics`` (a standby run's records up to the switch are the live run's). ``also_stop`` (the
    service's stop) ends it too, so a run nobody took over never outlives the service.
    """

    def __init__(
        self,
        run: Callable[[threading.Event, threading.Event, threading.Event], object],
        *,
        name: str,
        also_stop: threading.Event | None = None,
    ) -> None:
        self._run = run
        self.stop_event = threading.Event()
        self.commit = threading.Event()
        self.counted = threading.Event()
        self._also_stop = also_stop
        self._error: BaseException | None = None
        self._unasked = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self) -> None:
        """Start the run."""
        self._thread.start()

    def _main(self) -> None:
        watcher: threading.Thread | None = None
        if self._also_stop is not None:
            watcher = threading.Thread(
                target=relay, args=(self._also_stop, self.stop_event), name="throughline-run-stop", daemon=True
            )
            watcher.start()
        try:
            self._run(self.stop_event, self.commit, self.counted)
        except BaseException as exc:  # handed to whoever waits for the run (``raise_failure``, ``wait``)
            self._error = exc
        else:
            self._unasked = not self.stop_event.is_set()
        finally:
            self.stop_event.set()  # ends the watcher
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
        self.stop_event.set()
        if self._thread.ident is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise RebuildRefusedError(f"a projector run of the rebuild did not stop within {timeout:g}s")


class PausableProjector(Generic[H]):
    """The live projector loop of ``serve`` (a ``ProjectorThread`` loop) over a projection that a switch
    replaces: ``pause`` ends the run in progress (its staged polls committed) and holds the next one
    until ``resume`` names the projection it goes on with, and, optionally, the run already going on
    over it (``standby``), which the loop then follows instead of starting one.

    One owner: the projection, whether the loop is paused, the run in progress (its stop and commit
    events) and a run handed over but not picked up yet are this object's, changed under its lock.
    """

    def __init__(self, run: LiveRun[H], projection: H) -> None:
        self._run = run
        self._cond = threading.Condition()
        self._projection = projection
        self._paused = False
        self._running = False
        self._stop_run: threading.Event | None = None
        self._commit = threading.Event()
        self._handed: RunThread | None = None  # resumed with, not picked up by the loop yet
        self._ended = False  # the loop returned on the service's stop: nothing picks up a run any more

    @property
    def projection(self) -> H:
        """The projection the live projector writes."""
        with self._cond:
            return self._projection

    def standby(self, projection: H, also_stop: threading.Event) -> RunThread:
        """Start a live run over ``projection`` beside the run in progress, on a thread of its own (so that
        it is warm when a switch hands it over: ``resume(projection, run)``); it counts nothing into
        ``/metrics`` until its ``counted`` is set. The caller stops it unless it hands it over."""
        runner = RunThread(
            lambda stop, commit, counted: self._run(projection, stop, commit, counted),
            name="throughline-standby-projector",
            also_stop=also_stop,
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
                    self._stop_run, self._commit, self._running = threading.Event(), threading.Event(), True
                run_stop, commit = self._stop_run, self._commit
                projection = self._projection
            if stop.is_set():
                if handed is not None:
                    self._finish(handed.stop)
                return None
            assert run_stop is not None
            watcher = threading.Thread(target=relay, args=(stop, run_stop), name="throughline-pause", daemon=True)
            watcher.start()
            try:
                if handed is None:
                    self._run(projection, run_stop, commit)
                else:
                    handed.wait()  # the run handed over is this loop's run from here
            finally:
                run_stop.set()
                self._finish(watcher.join)
            with self._cond:
                if not self._paused:
                    self._ended = stop.is_set()
                    return None  # stopped by the service (or by itself: the ProjectorThread says so)
        return None

    def _finish(self, wait: Callable[[], object]) -> None:
        """``wait`` for the run in progress to be over, then say so to a ``pause`` waiting for it."""
        try:
            wait()
        finally:
            with self._cond:
                self._running = False
                self._cond.notify_all()

    def pause(self, timeout: float) -> bool:
        """End the run in progress (its staged polls committed) and hold the next; ``True`` once it
        returned within ``timeout``."""
        with self._cond:
            self._paused = True
            self._commit.set()
            if self._stop_run is not None:
                self._stop_run.set()
            return self._cond.wait_for(lambda: not self._running, timeout)

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
                self._handed = standby
                self._stop_run, self._commit, self._running = standby.stop_event, standby.commit, True
            self._paused = False
            self._cond.notify_all()
        if orphan is not None:
            orphan.stop()


def relay(stop: threading.Event, run_stop: threading.Event) -> None:
    """Set ``run_stop`` when ``stop`` is set; ends with the run (bounded by the run's life)."""
    while not run_stop.wait(_WATCH):
        if stop.is_set():
            run_stop.set()
