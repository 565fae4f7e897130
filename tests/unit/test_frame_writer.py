"""The fetch worker's frames: the writer puts them on the pipe whole and in order, the last one (an
error, typically) before the worker exits, and a reader that went away never hangs the worker; the
parent takes a frame it cannot load for the retriable ``fetch_worker_failed``."""

from __future__ import annotations

import os
import pickle
import threading
import time

from throughline.projector.feed.frames import FRAME_HEADER, FRAMES_AHEAD, FrameWriter


def _frames(fd: int) -> list[tuple[str, object]]:
    out = []
    with os.fdopen(fd, "rb") as f:
        while header := f.read(FRAME_HEADER.size):
            out.append(pickle.loads(f.read(FRAME_HEADER.unpack(header)[0])))
    return out


def test_frames_arrive_in_order_and_close_flushes_the_last():
    r, w = os.pipe()
    out = os.fdopen(w, "wb")
    writer = FrameWriter(out)
    got: list = []
    reader = threading.Thread(target=lambda: got.extend(_frames(r)))
    reader.start()
    for i in range(50):
        writer.send("batches", [i] * 10_000)  # frames larger than the pipe
    writer.send("error", ValueError("last words"))
    writer.close()
    out.close()
    reader.join(timeout=30)
    assert [kind for kind, _ in got] == ["batches"] * 50 + ["error"]
    assert [p[0] for k, p in got if k == "batches"] == list(range(50))
    assert str(got[-1][1]) == "last words"


def test_the_writer_runs_ahead_of_a_slow_reader_by_a_bounded_number_of_frames():
    r, w = os.pipe()
    out = os.fdopen(w, "wb")
    writer = FrameWriter(out)
    sent = 0
    blocked = threading.Event()

    def produce() -> None:
        nonlocal sent
        for _ in range(FRAMES_AHEAD + 5):
            writer.send("batches", b"x" * (2 << 20))  # two pipes' worth: the writer thread blocks on each
            sent += 1
        blocked.set()

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    time.sleep(1.0)  # nobody reads: the writer holds one frame, the queue FRAMES_AHEAD more
    assert not blocked.is_set()
    assert sent == FRAMES_AHEAD + 1
    got: list = []
    reader = threading.Thread(target=lambda: got.extend(_frames(r)))
    reader.start()  # reading unblocks the rest
    producer.join(timeout=30)
    assert blocked.is_set()
    writer.close()
    out.close()
    reader.join(timeout=30)
    assert len(got) == FRAMES_AHEAD + 5


def test_a_reader_that_went_away_stops_the_writer_without_hanging():
    r, w = os.pipe()
    os.close(r)
    writer = FrameWriter(os.fdopen(w, "wb"))
    start = time.monotonic()
    for _ in range(10):
        writer.send("batches", b"x" * 100_000)
    writer.close()
    assert writer.broken.is_set()
    assert time.monotonic() - start < 10


def test_a_frame_the_parent_cannot_load_is_the_retriable_fetch_worker_failed():
    # What an error class defined in the worker's ``__main__`` was to the parent (a defect once found): a pickle
    # naming an attribute of ``__main__`` this process does not have. It must still be
    # fetch_worker_failed (the run restarts the worker), never an AttributeError that ends the run.
    import subprocess
    import sys

    import pytest

    from throughline.projector.exceptions import FetchWorkerError
    from throughline.projector.feed import FeedSpec, ProjectorOptions, WorkerFeed, WorkerProcess

    main = sys.modules["__main__"]
    ghost = type("GhostWorkerError", (Exception,), {"__module__": "__main__"})
    main.GhostWorkerError = ghost  # type: ignore[attr-defined]
    try:
        data = pickle.dumps(("error", ghost("lost in __main__")))
    finally:
        del main.GhostWorkerError  # type: ignore[attr-defined]
    r, w = os.pipe()
    os.write(w, FRAME_HEADER.pack(len(data)) + data)
    os.close(w)
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.buffer.read()"], stdin=subprocess.PIPE)
    spec = FeedSpec(("127.0.0.1:9",), "t", 1, ((0, 0),), ProjectorOptions())
    feed = WorkerFeed(spec, WorkerProcess(proc, r))
    try:
        with pytest.raises(FetchWorkerError) as caught:
            feed.next(10)
        assert caught.value.retriable and caught.value.code == "fetch_worker_failed"
        assert "GhostWorkerError" in caught.value.message
        assert proc.poll() is not None  # the worker it came from is stopped
    finally:
        feed.close()
