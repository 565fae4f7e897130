"""``throughline observe`` against the real broker and projector: kill, audit failure, pending, resync."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reader_env import Env, clean_env
from support.cursor import cursor_length

from throughline.reader import load_observer_state


@pytest.fixture
def env(kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    return Env.isolated(kafka_bootstrap, kafka_topic_name, tmp_path, monkeypatch)


def _audited(path: Path) -> list[tuple[int, str]]:
    if not path.exists():
        return []
    out = []
    lines = path.read_text().split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            if i == len(lines) - 1:  # still being written by the audit command
                break
            raise
        out.append((doc["seq"], doc["contentDigest"]))
    return out


def _observe_argv(env: Env, state: Path, *extra: str) -> list[str]:
    return [
        "observe",
        "--project",
        env.project,
        "--state",
        str(state),
        *env.connection,
        "--wait",
        "0",
        *extra,
    ]


def _observed(env: Env, turns: int) -> tuple[Path, bytes]:
    """``turns`` turns ingested, projected and observed once: the Observer state file and what it holds."""
    state = env.tmp / "s.json"
    env.ingest_n(turns)
    env.project_log()
    assert env.cli(*_observe_argv(env, state))[0] == 0
    return state, state.read_bytes()


def test_observer_killed_mid_series_resumes_without_gap_or_duplicate(env: Env) -> None:
    state = env.tmp / "observer-state.json"
    env.ingest_n(6)
    env.project_log()
    code, out, err = env.cli(*_observe_argv(env, state, "--limit", "4"))
    assert code == 0, err
    assert [json.loads(line)["seq"] for line in out.splitlines()] == [3, 4, 5, 6]  # the snapshot
    assert "series: snapshot" in err and "history truncated" in err and "new cursor saved" in err
    saved = state.read_bytes()
    assert cursor_length(load_observer_state(state)) == 6

    env.ingest_n(20)
    env.project_log()
    slow_log = env.tmp / "audit-slow.log"
    slow = f"cat >> {slow_log}; echo >> {slow_log}; sleep 0.2"
    proc = subprocess.Popen(
        [sys.executable, "-m", "throughline.cli", *_observe_argv(env, state, "--limit", "4", "--exec", slow)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=clean_env(),
        start_new_session=True,  # its own process group: the kill takes the audit command too
    )
    try:
        deadline = time.monotonic() + 90
        while len(_audited(slow_log)) < 7 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        if proc.stderr:
            proc.stderr.close()
    killed = _audited(slow_log)
    assert 7 <= len(killed) < 20  # killed mid-series
    assert state.read_bytes() == saved  # the old cursor, untouched
    # A save happens only after a whole series, so the kill left no temporary state file either.
    assert not [n for n in os.listdir(state.parent) if n.startswith(f".{state.name}.")]

    fast_log = env.tmp / "audit-fast.log"
    code, out, err = env.cli(
        *_observe_argv(env, state, "--limit", "4", "--exec", f"cat >> {fast_log}; echo >> {fast_log}")
    )
    assert code == 0, err
    resumed = _audited(fast_log)
    assert [seq for seq, _ in resumed] == list(range(7, 27))  # right after the last audited series
    assert killed == resumed[: len(killed)]  # the killed run audited a prefix of the same series
    assert "series: delta" in err and "turns audited: 20" in err and "new cursor saved" in err
    assert cursor_length(load_observer_state(state)) == 26

    code, out, err = env.cli(*_observe_argv(env, state, "--exec", f"cat >> {fast_log}; echo >> {fast_log}"))
    assert code == 0 and "turns audited: 0" in err and "cursor unchanged" in err
    assert len(_audited(fast_log)) == 20


def test_a_failing_audit_exits_1_and_keeps_the_cursor(env: Env) -> None:
    state, saved = _observed(env, 3)
    env.ingest_n(5)
    env.project_log()
    code, out, err = env.cli(*_observe_argv(env, state, "--exec", "exit 3"))
    assert code == 1
    assert json.loads(err.strip().splitlines()[-1])["error"]["code"] == "audit_failed"
    assert state.read_bytes() == saved


def test_pending_gives_up_with_exit_1_then_succeeds(env: Env) -> None:
    state, saved = _observed(env, 3)
    env.ingest_n(2)
    code, out, err = env.cli(*_observe_argv(env, state, "--max-pending-wait", "0.5"))
    assert code == 1 and out == ""
    assert json.loads(err.strip().splitlines()[-1])["error"]["code"] == "projection_pending"
    assert state.read_bytes() == saved
    env.project_log()
    code, out, err = env.cli(*_observe_argv(env, state))
    assert code == 0 and [json.loads(line)["seq"] for line in out.splitlines()] == [4, 5]


def test_resync_policies(env: Env) -> None:
    state, saved = _observed(env, 6)
    env.ingest([env.turn(seq=2)])
    env.project_log()
    code, out, err = env.cli(*_observe_argv(env, state, "--on-resync", "fail"))
    assert code == 1 and json.loads(err.strip().splitlines()[-1])["error"]["code"] == "resync_required"
    assert state.read_bytes() == saved
    code, out, err = env.cli(*_observe_argv(env, state))
    assert code == 0
    assert "discarding the saved after cursor" in err and "series: snapshot" in err
    assert [json.loads(line)["seq"] for line in out.splitlines()] == [1, 2]
    assert cursor_length(load_observer_state(state)) == 2


def test_follow_runs_series_until_sigterm(env: Env) -> None:
    state = env.tmp / "s.json"
    env.ingest_n(3)
    env.project_log()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "throughline.cli",
            *_observe_argv(env, state, "--follow", "--interval", "0.2"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert state.exists() and proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert [json.loads(line)["seq"] for line in out.decode().splitlines()] == [1, 2, 3]
    assert b"stopped after" in err and b"series: snapshot" in err
    assert cursor_length(load_observer_state(state)) == 3
