"""The frames between the fetch worker and the projector: length-prefixed pickles on a pipe.

A frame is ``(kind, payload)``: ``("batches", [PreparedBatch, ...])`` (one poll of the worker) or
``("error", exc)`` (its last frame: a ``LogError`` or ``FetchWorkerError``). On the pipe it is an
8-byte big-endian length (``FRAME_HEADER``) and then the pickle. The worker writes its frames with a
``FrameWriter`` (from a thread, at most ``FRAMES_AHEAD + 1`` polls ahead of the parent); the parent
reads them with a ``FrameReader``.
"""

from __future__ import annotations

import io
import os
import pickle
import queue
import select
import struct
import threading
import time
from typing import Any, BinaryIO

from throughline.projector.exceptions import FetchWorkerError

#: The length of the pickle that follows (8 bytes, big-endian).
FRAME_HEADER = struct.Struct(">Q")
#: Frames that may wait in the worker's queue besides the one being written (each holds one poll).
#: Two smoothed the pipeline no better than one and added a poll of latency under live load.
FRAMES_AHEAD = 1
BATCHES = "batches"
ERROR = "error"

Frame = tuple[str, Any]


def dumps(obj: Any) -> bytes:
    """``obj`` pickled as a frame's payload (no memo)."""
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    # No memo: a frame holds no shared or recursive objects, and memoizing every body and digest of a
    # poll cost more than pickling them.
    pickler.fast = True
    pickler.dump(obj)
    return buf.getvalue()


def frame_bytes(kind: str, payload: Any) -> bytes:
    """One whole frame as it stands on the pipe (header and pickle)."""
    data = dumps((kind, payload))
    return FRAME_HEADER.pack(len(data)) + data


def _read_into(fd: int, view: memoryview) -> bool:
    """Fill ``view`` from ``fd``; ``False`` at end of file."""
    got, n = 0, len(view)
    while got < n:
        k = os.readv(fd, [view[got:]])
        if k == 0:
            return False
        got += k
    return True


class FrameReader:
    """Reads frames from the read end of a worker's pipe (the parent's side)."""

    def __init__(self) -> None:
        self._header = bytearray(FRAME_HEADER.size)
        # One buffer for every frame, grown to the largest: a new one per frame (~10 MB) cost its
        # zero-fill and page faults, ~9% of the main process's time. It outlives worker restarts.
        self._frame = bytearray()

    def read(self, fd: int, timeout: float) -> Frame | None:
        """The next frame on ``fd``; ``None`` when none came within ``timeout`` seconds.

        Raises ``EOFError`` when the pipe ended (the worker exited) before a whole frame. A frame that
        does not load (a class the worker pickled that this process cannot load) is returned as an
        ``("error", FetchWorkerError)`` frame: still retriable.
        """
        ready, _, _ = select.select([fd], [], [], max(0.0, timeout))
        if not ready:
            return None
        header = memoryview(self._header)
        if not _read_into(fd, header):
            raise EOFError
        size = FRAME_HEADER.unpack(header)[0]
        if size > len(self._frame):
            self._frame = bytearray(size)
        frame = memoryview(self._frame)[:size]
        if not _read_into(fd, frame):
            raise EOFError
        try:
            taken: Frame = pickle.loads(frame)
        except Exception as exc:
            return ERROR, FetchWorkerError(f"a frame of the fetch worker does not load: {type(exc).__name__}: {exc}")
        return taken


class FrameWriter:
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
                self._out.write(FRAME_HEADER.pack(len(data)))
                self._out.write(data)
                self._out.flush()
            except (BrokenPipeError, ValueError):
                self.broken.set()
                return

    def send(self, kind: str, payload: Any) -> None:
        """Queue one frame (blocks while ``FRAMES_AHEAD`` frames wait for the main process)."""
        try:
            data = dumps((kind, payload))
        except Exception:  # an error that does not pickle still reaches the parent, as text
            data = dumps((ERROR, FetchWorkerError(f"the fetch worker failed: {payload!r}")))
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
