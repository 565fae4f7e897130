"""The freshness breakdowns beside Kafka Streams (bench/serve_trace.py, bench/streams_profile.py) and the
flight recorder's summary (bench/jfr.py): the joins by log position, the step arithmetic, and that the trace's
hooks find the functions they wrap in a real ``serve`` import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import jfr, serve_trace
from bench.streams_profile import _peer_breakdown


def _write(folder: Path, name: str, lines: list[str]) -> None:
    (folder / name).write_text("\n".join(lines) + "\n")


def test_each_turn_is_placed_on_the_projectors_steps(tmp_path: Path) -> None:
    # Worker process: partition 0 polled up to offset 9 at t=10.004, sent (next 10) at 10.006; a later poll.
    _write(
        tmp_path,
        "trace-1.txt",
        [
            "poll 10.004000 0 9 10",
            "sent 10.006000 0 10",
            "poll 10.050000 0 19 10",
            "sent 10.052000 0 20",
        ],
    )
    # Main process: the frame at 10.007, staged at 10.010; reads (t, total, end, wait, view).
    _write(
        tmp_path,
        "trace-2.txt",
        [
            "got 10.007000 0 10",
            "staged 10.010000 0 10",
            "got 10.053000 0 20",
            "staged 10.055000 0 20",
            "read 10.001000 9.000 1.000 7.000 0.500 0",
            "read 10.060000 3.000 1.000 1.000 0.500 0",
            "read 10.070000 900.000 0.000 0.000 0.500 1",  # a long-poll
            "read 99.000000 50.000 1.000 1.000 0.500 0",  # outside the window
            "staged 10.0",  # a line cut short
        ],
    )
    turns = [(0, 5, 10.000, 10.012), (0, 15, 10.045, 10.058), (1, 3, 10.0, 10.1)]  # the last: never traced
    got = serve_trace.breakdown(tmp_path, turns, (10.0, 11.0))
    assert got["joined"] == 2
    assert got["turns"] == 3
    # Turn 1: poll 4 ms after its append, sent +2, got +1, staged +3, readable +2; turn 2: 5, 2, 1, 2, 3.
    assert got["steps"]["poll"][0] == pytest.approx(4.5)
    assert got["steps"]["sent"][0] == pytest.approx(2.0)
    assert got["steps"]["got"][0] == pytest.approx(1.0)
    assert got["steps"]["staged"][0] == pytest.approx(2.5)
    assert got["steps"]["readable"][0] == pytest.approx(2.5)
    assert got["reads"] == 2
    assert got["read"]["total"][0] == pytest.approx(6.0)
    assert got["read"]["wait"][0] == pytest.approx(4.0)


def test_an_offset_is_covered_by_the_first_event_that_reaches_it(tmp_path: Path) -> None:
    # A later event covering less (a restart re-fetching) does not move a turn's instant.
    _write(tmp_path, "trace-1.txt", ["poll 1.0 0 10 11", "poll 2.0 0 5 6", "poll 3.0 0 20 10"])
    events, _ = serve_trace.load(tmp_path)
    assert events["poll"][0] == ([10, 20], [1.0, 3.0])


def test_the_peers_fold_is_joined_by_exact_offset() -> None:
    folded = {0: ([4, 5, 6], [10.002, 10.003, 10.009])}
    got = _peer_breakdown(folded, [(0, 5, 10.000, 10.004), (0, 7, 10.0, 10.2), (2, 5, 10.0, 10.2)])
    assert got["joined"] == 1
    assert got["steps"]["folded"][0] == pytest.approx(3.0)
    assert got["steps"]["readable"][0] == pytest.approx(1.0)


_JFR_TEXT = """
jdk.ExecutionSample {
  startTime = 09:17:11.192
  sampledThread = "bench-ks-1a2b3c4d-0f5e9d8c-1111-2222-3333-444455556666-StreamThread-1" (javaThreadId = 30)
  state = "STATE_RUNNABLE"
  stackTrace = [
    org.rocksdb.RocksDB.put(long, byte[]) line: 12
    throughline.bench.Main$Fold.process(org.apache.kafka.streams.processor.api.Record) line: 210
  ]
}

jdk.NativeMethodSample {
  startTime = 09:17:11.200
  sampledThread = "HTTP-Dispatcher" (javaThreadId = 31)
  state = "STATE_IN_NATIVE"
  stackTrace = [
    sun.nio.ch.EPoll.wait(int, long, int, int) line: 0
    sun.nio.ch.EPollSelectorImpl.doSelect(long) line: 129
  ]
}

jdk.NativeMethodSample {
  startTime = 09:17:11.210
  sampledThread = "pool-2-thread-3" (javaThreadId = 40)
  state = "STATE_IN_NATIVE"
  stackTrace = [
    org.rocksdb.RocksDB.get(long, byte[]) line: 0
    ...
  ]
}
"""


def test_a_flight_recording_is_summarised_like_a_py_spy_profile() -> None:
    prof = jfr.parse(_JFR_TEXT, "peer")
    # One Java sample (weight 1) and one native sample in RocksDB (weight 2); the epoll wait is idle.
    assert prof.samples == 3
    assert prof.idle == 2
    assert dict(prof.self_top) == pytest.approx({"RocksDB.get": 2 / 3, "RocksDB.put": 1 / 3})
    assert dict(prof.threads) == pytest.approx({"pool-N-thread-N": 2 / 3, "StreamThread-1": 1 / 3})
    assert ("Main$Fold.process", pytest.approx(1 / 3)) in prof.inclusive_top
    assert "Flight Recorder" in prof.markdown()


def test_no_working_sample_is_an_error_not_a_profile() -> None:
    assert jfr.parse("", "peer").error


def test_the_hooks_wrap_the_functions_serve_runs(tmp_path: Path) -> None:
    # In a fresh interpreter started as a traced serve is: every traced function is the trace's wrapper.
    env = serve_trace.serve_env(tmp_path)
    code = (
        "import throughline.serve.read_api as a, throughline.projector.store.projection as p, "
        "throughline.projector.feed.worker as w, throughline.projector.feed.frames as f, "
        "throughline.projector.feed.poller as q, throughline.log.view as v\n"
        "fs = [a.ReadApi.answer, p.DuckProjection.stage, p.DuckProjection.read, p.DuckProjection.wait_settled, "
        "w.WorkerFeed.next, f.FrameWriter.send, q.Fetcher._poll_into, v.KafkaLog.end_offset]\n"
        "print(*(x.__module__ for x in fs))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["bench.serve_trace"] * 8
    untraced = {k: v for k, v in os.environ.items() if k != serve_trace.ENV}
    untraced["PYTHONPATH"] = env["PYTHONPATH"]
    out = subprocess.run(
        [sys.executable, "-c", code], env=untraced, capture_output=True, text=True, timeout=120, check=True
    )
    assert "bench.serve_trace" not in out.stdout.split()  # without the variable, nothing is wrapped
