"""The fetch worker: the ``Fetcher`` in a child process, one poll ahead of the projector.

While the main process folds and writes poll N, the worker fetches, decodes and checks poll N+1, so
the projector uses two cores. One check runs in the main process: the content digest (a SHA-256 over
each body, ~9% of the worker's time; ``prepare_batch(defer_content=True)``, ``check_content`` in
``WorkerFeed.next``): the worker was the slower of the two (docs/design.md, "The content digest is
checked in the main process"). A thread cannot do this: DuckDB's binding and the decoder both hold the
GIL most of the time (measured: a writer thread was 5-15% slower than one thread). The worker holds no
state worth keeping: it starts at the offsets the projection applied, and after any failure it is
started again from them.

The worker is ``python -m throughline.projector.feed FD PARENT_PID`` (the package's ``__main__``, which
only calls ``worker_main`` here, so that nothing the worker pickles is defined in ``__main__``, which
the parent could not load): it reads a pickled ``FeedSpec`` from stdin and writes frames
(``throughline.projector.feed.frames``) to the pipe ``FD``. It exits when its parent dies
(``PDEATHSIG`` on Linux, and a parent check each poll), so a killed projector leaves no fetcher
behind. (``PDEATHSIG`` fires when the thread that started the worker ends; the projector's run, which
that thread executes, always stops the worker before it returns.)

Nothing here imports DuckDB or Arrow, so the worker starts quickly.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import BinaryIO

from throughline.log import LogError
from throughline.projector.exceptions import FetchWorkerError
from throughline.projector.feed.frames import BATCHES, ERROR, Frame, FrameReader, FrameWriter
from throughline.projector.feed.poller import Feed, FeedSpec, Fetcher, LocalFeed
from throughline.projector.prepare import PreparedBatch, check_content, merge_polls
from throughline.runtime import die_with_parent, fewer_gc_passes
from throughline.schemas.exceptions import RegistryError

#: The module ``spawn_worker`` runs with ``python -m``.
WORKER_MODULE = "throughline.projector.feed"
_F_SETPIPE_SZ = 1031  # fcntl: a 1 MiB pipe moves a poll of ~12 MB in fewer, larger copies
_PIPE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class WorkerProcess:
    """A started fetch worker still waiting for its ``FeedSpec`` (its imports take ~0.3 s)."""

    proc: subprocess.Popen[bytes]
    read_fd: int

    def stop(self) -> int | None:
        """Kill it (stateless: nothing of it needs a clean shutdown) and return its exit code."""
        os.close(self.read_fd)
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # still open when it is stopped before it got its spec
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
            return None


def spawn_worker() -> WorkerProcess:
    """Start a fetch worker process; ``WorkerFeed`` hands it its spec.

    The projector starts it before it checks the topic, so that the worker's imports overlap the
    checks instead of delaying the first batch.
    """
    read_fd, write_fd = os.pipe()
    with contextlib.suppress(OSError):  # Linux only; elsewhere the default pipe size just costs copies
        import fcntl

        fcntl.fcntl(write_fd, _F_SETPIPE_SZ, _PIPE_BYTES)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", WORKER_MODULE, str(write_fd), str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            pass_fds=(write_fd,),
            close_fds=True,
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)  # the child's copy is the only writer: its death is our EOF
    return WorkerProcess(proc, read_fd)


def spawn_worker_ahead(timeout: float = 30.0) -> WorkerProcess:
    """``spawn_worker`` for a run that starts later, on another thread (``serve``'s rebuild starts the new
    file's worker while its replay still holds that file, so that the worker's imports are not inside
    the hand-over). The worker dies when the *thread* that started it ends (``PDEATHSIG``), so it is
    started from a thread of its own that lives as long as the worker does."""
    box: queue.Queue[WorkerProcess | BaseException] = queue.Queue()

    def keep() -> None:
        try:
            worker = spawn_worker()
        except BaseException as exc:  # handed to the caller
            box.put(exc)
            return
        box.put(worker)
        worker.proc.wait()

    threading.Thread(target=keep, name="throughline-fetch-worker-ahead", daemon=True).start()
    got = box.get(timeout=timeout)
    if isinstance(got, BaseException):
        raise got
    return got


class WorkerFeed:
    """The ``Fetcher`` in a child process, a few polls ahead of the caller."""

    def __init__(self, spec: FeedSpec, process: WorkerProcess | None = None) -> None:
        self._spec = spec
        self._worker: WorkerProcess | None = None
        self._frames = FrameReader()
        self._held: Frame | None = None  # a frame read but not returned yet
        self._start(spec, process)

    @property
    def worker(self) -> WorkerProcess | None:
        """The worker process running now (``None`` once it died and was reaped, or the feed closed)."""
        return self._worker

    def _start(self, spec: FeedSpec, process: WorkerProcess | None = None) -> None:
        process = process or spawn_worker()
        self._worker = process
        assert process.proc.stdin is not None
        try:
            process.proc.stdin.write(pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL))
            process.proc.stdin.close()
        except BrokenPipeError:
            pass  # the worker died at once; ``next`` reports how

    def next(self, timeout: float) -> list[PreparedBatch]:
        """See ``Feed.next``: every frame the worker has already written, as one poll.

        Each frame is one of the worker's polls. Under steady ingest the worker polls whenever a few
        records arrive, so frames are small, and the pipe (1 MiB) holds hundreds of them; taken one
        transaction each, they queued behind each other for seconds (measured: ~430 records, ~2 s
        behind the log at 200 turns/s). Taking them all at once, up to ``max_poll_records``, makes a
        transaction hold what arrived while the previous one was written, as ``LocalFeed`` does.
        """
        frame = self._take(timeout)
        if frame is None:
            return []
        polls = [self._batches(frame)]
        count = sum(len(b.items) for b in polls[0])
        limit = self._spec.options.max_poll_records
        while count < limit:
            frame = self._take(0.0)
            if frame is None:
                break
            if frame[0] != BATCHES or count + sum(len(b.items) for b in frame[1]) > limit:
                self._held = frame  # an error, or too much for this poll: the next call starts with it
                break
            polls.append(frame[1])
            count += sum(len(b.items) for b in frame[1])
        return [check_content(b) for b in merge_polls(polls)]

    def _batches(self, frame: Frame) -> list[PreparedBatch]:
        kind, payload = frame
        if kind == BATCHES:
            batches: list[PreparedBatch] = payload
            return batches
        self._reap()
        raise payload

    def _take(self, timeout: float) -> Frame | None:
        """The next frame: ``("batches", [...])`` or ``("error", exc)``; ``None`` when none came in time."""
        if self._held is not None:
            held, self._held = self._held, None
            return held
        if self._worker is None:
            raise FetchWorkerError("the fetch worker is closed")
        try:
            return self._frames.read(self._worker.read_fd, timeout)
        except EOFError:
            code = self._reap()
            return ERROR, FetchWorkerError(f"the fetch worker exited (exit code {code}) without saying why")

    def restart(self, offsets: Mapping[int, int]) -> None:
        """See ``Feed.restart``."""
        self._reap()
        self._held = None
        self._start(self._spec.at(offsets))

    def _reap(self) -> int | None:
        worker, self._worker = self._worker, None
        return None if worker is None else worker.stop()

    def close(self) -> None:
        """See ``Feed.close``."""
        self._reap()


def open_feed(spec: FeedSpec, worker: WorkerProcess | None = None) -> Feed:
    """The feed ``spec.options`` asks for (``WorkerFeed`` unless ``fetch_worker`` is off), on ``worker``
    when one was started ahead (``spawn_worker``)."""
    if not spec.options.fetch_worker:
        if worker is not None:
            worker.stop()
        return LocalFeed(spec)
    return WorkerFeed(spec, worker)


# ------------------------------------------------------------------------------------------ the worker


def worker_main(fd: int, parent: int) -> int:
    """The worker process: fetch and prepare until the parent goes away or an error is sent."""
    die_with_parent(signal.SIGKILL)  # the parent check in the loop covers where it cannot be armed
    if os.getppid() != parent:
        return 0  # the parent died before PDEATHSIG was armed
    spec: FeedSpec = pickle.load(sys.stdin.buffer)
    out = os.fdopen(fd, "wb")
    try:
        with fewer_gc_passes(spec.options.gc_threshold):
            return _serve(spec, parent, out)
    except BrokenPipeError:
        return 0  # the parent closed its end: it stopped, or restarts us
    finally:
        with contextlib.suppress(OSError):
            out.close()


def _serve(spec: FeedSpec, parent: int, out: BinaryIO) -> int:
    writer = FrameWriter(out)
    try:
        return _fetch_until_stopped(spec, parent, writer)
    finally:
        writer.close()


def _fetch_until_stopped(spec: FeedSpec, parent: int, writer: FrameWriter) -> int:
    try:
        fetcher = Fetcher(spec, defer_content=True)  # the parent checks the content (``WorkerFeed.next``)
    except Exception as exc:  # a broker that does not answer, mostly: the parent explains it
        writer.send(ERROR, exc)
        return 1
    try:
        while os.getppid() == parent and not writer.broken.is_set():
            try:
                batches = fetcher.fetch(spec.options.poll_timeout)
            except (LogError, RegistryError) as exc:  # the parent retries a retriable one
                writer.send(ERROR, exc)
                return 1
            except Exception as exc:
                detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                writer.send(ERROR, FetchWorkerError(f"the fetch worker failed: {detail}"))
                return 1
            if batches:
                writer.send(BATCHES, batches)
    finally:
        fetcher.close()
    return 0
