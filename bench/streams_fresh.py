"""The freshness sweep's rig (``bench.freshness_rig``) around the Kafka Streams peer instead of
``throughline serve``: the same topic settings, producers, pacing, sampling and bounds; only the server
and its read path differ.

A poller's read of an acknowledged turn at ``(partition, offset)`` of project P is the peer's
``GET /page?project=SHA256(P)&partition=..&offset=..&limit=10``: an IQv2 query bounded by that log
position (``PositionBound.at``). 200 (the page) makes the turn readable; 409 is the store's
``NOT_UP_TO_BOUND`` (counted as a read not answered, status ``not_up_to_bound``), and the poller retries
as it does on the projector's pages. The peer has no long-poll and no ``/readyz``: the follower thread
reads the peer's ``/status`` (the last offset folded per partition) every ``STATUS_EVERY_S`` so that the
rig's end-of-cell wait ends as soon as the peer folded the cell's turns (its ack -> delivered column is
therefore not a long-poll figure and is not reported for the peer), and there is no lag sampling.
"""

from __future__ import annotations

import math
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from bench import jfr, streams_peer
from bench.common import Config, end_offsets
from bench.freshness_rig import (
    DRAIN_BOUND_S,
    FIRST_PAGE_LIMIT,
    POLL_BOUND_S,
    Rig,
    _CellStats,
    _Http,
    stop_serve,
)
from throughline.core.identity import project_sha256

STATUS_EVERY_S = 0.05
_START_BOUND_S = 120.0


def start_peer(
    bootstrap: str, topic: str, state: Path, guarantee: str, *, trace: bool = False
) -> tuple[subprocess.Popen[str], str]:
    """Start the peer serving ``topic`` (a fresh application id and state dir; ``trace``: keeping when each
    record became readable, ``StreamsRig.folded``); return it and its URL."""
    cmd = streams_peer.command(bootstrap, topic, state, guarantee, port=0, trace=trace)
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline() if proc.stdout else ""), daemon=True).start()
    try:
        line = lines.get(timeout=_START_BOUND_S)
    except queue.Empty:
        stop_serve(proc)
        raise RuntimeError(f"the Kafka Streams peer printed nothing within {_START_BOUND_S:.0f} s") from None
    if '"started"' not in line:
        stop_serve(proc)
        raise RuntimeError(f"the Kafka Streams peer did not start: {line!r}")
    port = int(line.split('"port":', 1)[1].split("}", 1)[0])
    return proc, f"http://127.0.0.1:{port}"


class StreamsRig(Rig):
    """``Rig`` with the Kafka Streams peer as the server (``guarantee``: its processing guarantee)."""

    topic_prefix = "ksfresh"

    def __init__(
        self, cfg: Config, bootstrap: str, workdir: Path, guarantee: str, *, trace: Path | None = None
    ) -> None:
        self.guarantee = guarantee
        super().__init__(cfg, bootstrap, workdir, trace=trace)

    def _start_server(self) -> tuple[Any, str]:
        """The Kafka Streams peer (``self.guarantee``) serving its own HTTP endpoint over ``self.topic``
        (traced when ``self.trace`` is set: ``folded``)."""
        return start_peer(
            self.bootstrap,
            self.topic,
            self.workdir / f"ks-fresh-{self.guarantee}",
            self.guarantee,
            trace=self.trace is not None,
        )

    def _recording(self, label: str) -> Any:
        """The profiler of a profile cell: the JVM's flight recorder (``bench.jfr``)."""
        return jfr.recording(label, self.workdir / f"ks-{self.guarantee}.jfr", pid=self.proc.pid)

    def folded(self) -> dict[int, tuple[list[int], list[float]]]:
        """When the traced peer made each record readable (its ``GET /trace``, the last 262,144 records):
        per partition, offsets and monotonic seconds in offset order."""
        http_ = _Http(self.url)
        try:
            code, body = http_.get_bytes("/trace", timeout=60)
        finally:
            http_.close()
        pairs: dict[int, list[tuple[int, float]]] = {}
        for line in (body or b"").decode().splitlines() if code == 200 else []:
            p, o, ns = line.split()
            pairs.setdefault(int(p), []).append((int(o), int(ns) / 1e9))
        return {p: ([o for o, _ in sorted(v)], [t for _, t in sorted(v)]) for p, v in pairs.items()}

    def _status(self, http_: _Http) -> dict[int, int] | None:
        code, doc = http_.get("/status", timeout=10)
        if code != 200 or not doc or doc.get("state") != "RUNNING":
            return None
        return {int(p): int(o) for p, o in (doc.get("positions") or {}).items()}

    def _follow(
        self,
        http_: _Http,
        stats: _CellStats,
        project: str,
        partition: int,
        offset: int,
        acked: float,
        stamped: float,
    ) -> None:
        """Re-read the project's first page, bounded by the acknowledged position, until the peer answers it."""
        deadline = acked + POLL_BOUND_S
        path = f"/page?project={project_sha256(project).hex()}&partition={partition}&offset={offset}&limit={FIRST_PAGE_LIMIT}"
        with stats.lock:
            stats.pickup_ms.append((time.monotonic() - stamped) * 1000)
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            code, _doc = http_.get(path, timeout=POLL_BOUND_S)
            now = time.monotonic()
            status = "ok" if code == 200 else "not_up_to_bound" if code == 409 else f"http_{code}"
            stats.read(status, (time.perf_counter() - t0) * 1000)
            if code == 200:
                with stats.lock:
                    stats.readable_ms.append((now - acked) * 1000)
                    stats.turns.append((partition, offset, acked, now))
                return
            time.sleep(0.002)
        with stats.lock:
            stats.missed += 1

    def _lag_sampler(self, stats: _CellStats, until: threading.Event) -> None:
        return  # the peer has no lag endpoint

    def _follower(self, stats: _CellStats, project: str, until: threading.Event) -> None:
        """The peer's folded positions, as covered positions for the rig's end-of-cell wait."""
        http_ = _Http(self.url)
        try:
            while not until.wait(STATUS_EVERY_S):
                positions = self._status(http_)
                now = time.monotonic()
                for p, o in (positions or {}).items():
                    stats.follow.append((now, p, o))
        finally:
            http_.close()

    def caught_up(self, bound_s: float = DRAIN_BOUND_S) -> float:
        """Wait until the peer folded everything in the log (its ``/status`` against the log's end)."""
        ends = {p: e for p, e in end_offsets(self.bootstrap, self.topic).items() if e > 0}
        http_ = _Http(self.url)
        start = time.monotonic()
        try:
            while time.monotonic() - start < bound_s:
                positions = self._status(http_)
                if positions is not None and all(positions.get(p, -1) >= e - 1 for p, e in ends.items()):
                    return time.monotonic() - start
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the Kafka Streams peer exited with {self.proc.returncode}")
                time.sleep(0.1)
        finally:
            http_.close()
        return math.inf
