"""Where the projector's batches come from: a ``Fetcher`` polls the topic and prepares each poll.

Two feeds run the same ``Fetcher`` and answer the same ``Feed`` contract:

- ``LocalFeed``: on the caller's thread. The projector then fetches, decodes, checks, folds and writes
  one poll after the other on one core.
- ``WorkerFeed`` (the default): in a child process. While the main process folds and writes poll N,
  the worker fetches, decodes and checks poll N+1, so the projector uses two cores. A thread cannot do
  this: DuckDB's binding and the decoder both hold the GIL most of the time (measured: a writer thread
  was 5-15% slower than one thread). The worker holds no state worth keeping: it starts at the offsets
  the projection applied, and after any failure it is started again from them.

The worker is ``python -m throughline.projector.feed_worker FD PARENT_PID`` (an entry point that only
calls ``worker_main`` here, so that nothing the worker pickles is defined in ``__main__``, which the
parent could not load): it reads a pickled ``FeedSpec``
from stdin and writes length-prefixed pickled frames to the pipe ``FD`` from a writer thread, at most
``FRAMES_AHEAD + 1`` polls ahead of the main process (then the fetch waits for it). It exits when its
parent dies (``PDEATHSIG`` on Linux, and a parent check each poll), so a killed projector leaves no
fetcher behind. (``PDEATHSIG`` fires when the thread that started the worker ends; the projector's run,
which that thread executes, always stops the worker before it returns.)

This module imports neither DuckDB nor Arrow, so the worker starts quickly.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import pickle
import queue
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, BinaryIO, Protocol

from throughline.log import KafkaClientConfig, LogError, PartitionConsumer
from throughline.projector.exceptions import FetchWorkerError
from throughline.projector.prepare import PreparedBatch, merge_polls, prepare_batch
from throughline.runtime import BULK_GC_THRESHOLD, die_with_parent, fewer_gc_passes

log = logging.getLogger(__name__)

DEFAULT_MAX_POLL_RECORDS = 10_000

_FRAME = struct.Struct(">Q")
_F_SETPIPE_SZ = 1031  # fcntl: a 1 MiB pipe moves a poll of ~12 MB in fewer, larger copies
_PIPE_BYTES = 1 << 20
#: Frames that may wait in the worker's queue besides the one being written (each holds one poll).
#: Two smoothed the pipeline no better than one and added a poll of latency under live load.
FRAMES_AHEAD = 1


@dataclass(frozen=True, slots=True)
class ProjectorOptions:
    """Tuning of the consume loop (the defaults suit both light and heavy load)."""

    max_poll_records: int = DEFAULT_MAX_POLL_RECORDS
    # A poll is one DuckDB transaction: under a backlog, 10k turns a commit cost ~10% less a turn
    # than 5k (the commit's fixed part, fewer frames). Live, a poll holds what has arrived, so the
    # size adds no latency. Fetches stay small (kafka-python reads 1-2 MB partition fetches 15-30%
    # faster than 8 MB ones) and a poll that is behind the log keeps fetching to fill up
    # (``fill_seconds``). Fetch sizes also bound what kafka-python buffers (the flat memory).
    fetch_max_bytes: int = 16 * 1024 * 1024
    max_partition_fetch_bytes: int = 2 * 1024 * 1024
    fetch_max_wait_ms: int = 100
    # How long a poll may keep fetching to fill up while the projector is far behind the log.
    fill_seconds: float = 0.2
    poll_timeout: float = 0.5
    check_interval: float = 5.0
    timeout: float = 15.0  # bound on connecting and on each broker request
    # Python's cyclic GC, at its default threshold (700 allocations), spent 25-35% of the apply time
    # walking the thousands of objects each poll creates; runs raise it (process-wide, restored after).
    gc_threshold: int | None = BULK_GC_THRESHOLD
    client_id: str = "throughline-projector"
    # Fetch, decode and check in a child process (``WorkerFeed``) while this one folds and writes.
    fetch_worker: bool = True


def open_consumer(spec: FeedSpec) -> PartitionConsumer:
    """The projector's consumer of ``spec``'s topic: no group, no auto-commit, no offset reset,
    committed records only, its polls returning ``FetchedRecord``s (partition, offset, key, value)."""
    o = spec.options
    return PartitionConsumer(
        spec.servers,
        spec.topic,
        spec.partitions,
        client_id=o.client_id,
        timeout=o.timeout,
        max_poll_records=o.max_poll_records,
        fetch_max_bytes=o.fetch_max_bytes,
        max_partition_fetch_bytes=o.max_partition_fetch_bytes,
        fetch_max_wait_ms=o.fetch_max_wait_ms,
        kafka_config=spec.kafka_config,
    )


@dataclass(frozen=True, slots=True)
class FeedSpec:
    """Everything a fetcher needs (it crosses to the worker process pickled)."""

    servers: tuple[str, ...]
    topic: str
    partitions: int
    start: tuple[tuple[int, int], ...]  # (partition, first offset to fetch)
    options: ProjectorOptions
    # How to connect; it crosses to the worker on its stdin pipe (never on a command line).
    kafka_config: KafkaClientConfig | None = None

    def at(self, offsets: Mapping[int, int]) -> FeedSpec:
        """This spec starting at ``offsets`` (partitions not named start at 0)."""
        return replace(self, start=tuple((p, int(offsets.get(p, 0))) for p in range(self.partitions)))


class Feed(Protocol):
    """A source of prepared batches, in log order per partition."""

    def next(self, timeout: float) -> list[PreparedBatch]:
        """The next poll's batches (one per partition), or ``[]`` when none came within ``timeout``.

        Raises the consumer's ``LogError``, or ``FetchWorkerError``.
        """
        ...

    def restart(self, offsets: Mapping[int, int]) -> None:
        """Fetch from ``offsets`` on (after an error; batches not yet returned are dropped)."""
        ...

    def close(self) -> None:
        """Release the consumer (and the worker process)."""
        ...


class Fetcher:
    """Polls the topic's partitions and prepares each poll (what both feeds run)."""

    def __init__(self, spec: FeedSpec) -> None:
        self._spec = spec
        self._consumer = open_consumer(spec)
        try:
            self._next: dict[int, int] = {}
            self.seek(dict(spec.start))
        except BaseException:
            self._consumer.close()
            raise

    def seek(self, offsets: Mapping[int, int]) -> None:
        """Fetch from ``offsets`` on."""
        self._next = {p: int(offsets.get(p, 0)) for p in range(self._spec.partitions)}
        for p, offset in self._next.items():
            self._consumer.seek(p, offset)

    def fetch(self, timeout: float) -> list[PreparedBatch]:
        """One poll, prepared; a batch's next offset is the consumer's position, past offsets that hold
        no record (an offset-only batch when the partition returned no record).

        Transaction markers and aborted records take offsets the consumer never returns; without this
        the applied offset would stay below the end offset, every first page of the partition's
        projects would wait for it, and ``--until-caught-up`` would never end.
        """
        o = self._spec.options
        polled: dict[int, list[Any]] = {}
        got = self._poll_into(polled, timeout, o.max_poll_records)
        # Far behind the log, keep polling until the poll is full: kafka-python reads small fetches
        # faster (its network thread competes for the GIL), and DuckDB commits large transactions
        # cheaper a record; this gives both. Only when the broker already holds the rest of the poll:
        # under steady ingest the records go at once (waiting for more would add latency, not speed).
        deadline = time.monotonic() + o.fill_seconds
        while 0 < got < o.max_poll_records and self._backlog() >= o.max_poll_records - got:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            got += self._poll_into(polled, left, o.max_poll_records - got)
        batches = []
        for p in range(self._spec.partitions):
            # The position is past every record the polls returned and past the offsets behind them
            # that hold no record (markers, aborted records): those count as applied with the batch.
            # On every partition, not only in a poll that returned nothing: while other partitions
            # are busy, a partition whose last offsets are markers would otherwise never reach its end.
            records = polled.get(p)
            position = self._consumer.position(p)
            end = records[-1].offset + 1 if records else self._next[p]
            skipped = position if position is not None and position > end else None
            if records or skipped is not None:
                batches.append(prepare_batch(p, records or [], partitions=self._spec.partitions, next_offset=skipped))
        for b in batches:
            self._next[b.partition] = b.next_offset
        return batches

    def _backlog(self) -> int:
        """Records the broker holds past the positions (as its last fetch responses reported)."""
        backlog = 0
        for p in range(self._spec.partitions):
            highwater = self._consumer.highwater(p)
            if highwater is not None:
                backlog += max(0, highwater - (self._consumer.position(p) or 0))
        return backlog

    def _poll_into(self, polled: dict[int, list[Any]], timeout: float, max_records: int) -> int:
        """One consumer poll appended to ``polled`` (records by partition); how many records came."""
        got = 0
        for partition, records in self._consumer.poll(timeout, max_records).items():
            polled.setdefault(partition, []).extend(records)
            got += len(records)
        return got

    def close(self) -> None:
        """Close the consumer."""
        self._consumer.close()


class LocalFeed:
    """The ``Fetcher`` on the caller's thread."""

    def __init__(self, spec: FeedSpec) -> None:
        self._fetcher = Fetcher(spec)

    def next(self, timeout: float) -> list[PreparedBatch]:
        """See ``Feed.next``."""
        return self._fetcher.fetch(timeout)

    def restart(self, offsets: Mapping[int, int]) -> None:
        """See ``Feed.restart``."""
        self._fetcher.seek(offsets)

    def close(self) -> None:
        """See ``Feed.close``."""
        self._fetcher.close()


def _read_into(fd: int, view: memoryview) -> bool:
    """Fill ``view`` from ``fd``; ``False`` at end of file."""
    got, n = 0, len(view)
    while got < n:
        k = os.readv(fd, [view[got:]])
        if k == 0:
            return False
        got += k
    return True


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
            [sys.executable, "-m", "throughline.projector.feed_worker", str(write_fd), str(os.getpid())],
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


class WorkerFeed:
    """The ``Fetcher`` in a child process, a few polls ahead of the caller."""

    def __init__(self, spec: FeedSpec, process: WorkerProcess | None = None) -> None:
        self._spec = spec
        self._worker: WorkerProcess | None = None
        self._header = bytearray(_FRAME.size)
        # One buffer for every frame, grown to the largest: a new one per frame (~10 MB) cost its
        # zero-fill and page faults, ~9% of the main process's time.
        self._frame = bytearray()
        self._held: tuple[str, Any] | None = None  # a frame read but not returned yet
        self._start(spec, process)

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
            if frame[0] != "batches" or count + sum(len(b.items) for b in frame[1]) > limit:
                self._held = frame  # an error, or too much for this poll: the next call starts with it
                break
            polls.append(frame[1])
            count += sum(len(b.items) for b in frame[1])
        return merge_polls(polls)

    def _batches(self, frame: tuple[str, Any]) -> list[PreparedBatch]:
        kind, payload = frame
        if kind == "batches":
            batches: list[PreparedBatch] = payload
            return batches
        self._reap()
        raise payload

    def _take(self, timeout: float) -> tuple[str, Any] | None:
        """The next frame: ``("batches", [...])`` or ``("error", exc)``; ``None`` when none came in time."""
        if self._held is not None:
            held, self._held = self._held, None
            return held
        if self._worker is None:
            raise FetchWorkerError("the fetch worker is closed")
        fd = self._worker.read_fd
        ready, _, _ = select.select([fd], [], [], max(0.0, timeout))
        if not ready:
            return None
        header = memoryview(self._header)
        frame = None
        if _read_into(fd, header):
            size = _FRAME.unpack(header)[0]
            if size > len(self._frame):
                self._frame = bytearray(size)
            frame = memoryview(self._frame)[:size]
            if not _read_into(fd, frame):
                frame = None
        if frame is None:
            code = self._reap()
            return "error", FetchWorkerError(f"the fetch worker exited (exit code {code}) without saying why")
        try:
            taken: tuple[str, Any] = pickle.loads(frame)
        except Exception as exc:  # a class the worker pickled that this process cannot load: still retriable
            return "error", FetchWorkerError(
                f"a frame of the fetch worker does not load: {type(exc).__name__}: {exc}"
            )
        return taken

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


def _dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    # No memo: a frame holds no shared or recursive objects, and memoizing every body and digest of a
    # poll cost more than pickling them.
    pickler.fast = True
    pickler.dump(obj)
    return buf.getvalue()


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


class _FrameWriter:
    """Writes the worker's frames to the pipe from a thread, up to ``FRAMES_AHEAD + 1`` behind the fetch.

    With the worker writing its frames itself, it waited for the main process to read each one (a
    frame of a full poll is several times the pipe), so any poll the main process took longer over
    stalled the fetch, and any poll the worker took longer over stalled the main process: both sides
    idled 15-30% of a run. A blocked ``write`` holds no GIL, so the thread costs the fetch nothing.
    """

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._frames: queue.Queue[bytes | None] = queue.Queue(maxsize=FRAMES_AHEAD)
        self.broken = threading.Event()  # the parent closed its end
        self._thread = threading.Thread(target=self._run, name="frame-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (data := self._frames.get()) is not None:
            try:
                self._out.write(_FRAME.pack(len(data)))
                self._out.write(data)
                self._out.flush()
            except (BrokenPipeError, ValueError):
                self.broken.set()
                return

    def send(self, kind: str, payload: Any) -> None:
        """Queue one frame (blocks while ``FRAMES_AHEAD`` frames wait for the main process)."""
        try:
            data = _dumps((kind, payload))
        except Exception:  # an error that does not pickle still reaches the parent, as text
            data = _dumps(("error", FetchWorkerError(f"the fetch worker failed: {payload!r}")))
        while not self.broken.is_set():
            try:
                self._frames.put(data, timeout=0.5)
                return
            except queue.Full:
                continue

    def close(self) -> None:
        """Write what is queued, then stop (an error frame must reach the parent before we exit)."""
        deadline = time.monotonic() + 30  # a parent that stops reading kills us long before
        while self._thread.is_alive() and time.monotonic() < deadline:
            try:
                self._frames.put(None, timeout=0.5)
                break
            except queue.Full:
                continue
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()))


def _serve(spec: FeedSpec, parent: int, out: BinaryIO) -> int:
    writer = _FrameWriter(out)
    try:
        return _fetch_until_stopped(spec, parent, writer)
    finally:
        writer.close()


def _fetch_until_stopped(spec: FeedSpec, parent: int, writer: _FrameWriter) -> int:
    try:
        fetcher = Fetcher(spec)
    except Exception as exc:  # a broker that does not answer, mostly: the parent explains it
        writer.send("error", exc)
        return 1
    try:
        while os.getppid() == parent and not writer.broken.is_set():
            try:
                batches = fetcher.fetch(spec.options.poll_timeout)
            except LogError as exc:
                writer.send("error", exc)
                return 1
            except Exception as exc:
                detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                writer.send("error", FetchWorkerError(f"the fetch worker failed: {detail}"))
                return 1
            if batches:
                writer.send("batches", batches)
    finally:
        fetcher.close()
    return 0
