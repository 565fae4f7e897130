"""Host transcripts end to end: ``ingest --format claude-code|codex`` and ``hook`` against a real broker.

The fixtures (tests/fixtures/hosts) are ingested by the real console script; the topic is read back
and folded into chains (and, once, projected and read with ``throughline read``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from support.topic import Stored, closed_port, read_topic

from throughline.core.fold import ChainBook
from throughline.core.turn import format_rfc3339

CLI = str(Path(sys.executable).with_name("throughline"))
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
RUN_TIMEOUT_S = 120.0
WAIT_TIMEOUT_S = 60.0


def env_for(bootstrap: str, topic: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["THROUGHLINE_BOOTSTRAP_SERVERS"] = bootstrap
    env["THROUGHLINE_TOPIC"] = topic
    env.pop("THROUGHLINE_DB", None)
    env.update(extra)
    return env


def cli(
    bootstrap: str, topic: str, *args: str, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *args],
        input=stdin,
        env=env_for(bootstrap, topic, **env),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def chains(records: list[Stored]) -> dict[tuple[str, str, str], list[str]]:
    book = ChainBook()
    for r in records:
        book.apply(r.turn, r.partition, r.offset, r.key)
    assert book.quarantined == []
    return {
        (ts[0].record.host, ts[0].record.thread, ts[0].record.project): [t.turn_id for t in ts]
        for ts in book.live.values()
        if ts
    }


def expected_chains(host: str) -> dict[tuple[str, str, str], list[str]]:
    return {(c["host"], c["thread"], c["project"]): c["turnIds"] for c in EXPECTED["chains"] if c["host"] == host}


def expected_records(host: str) -> list[tuple[str, str, int, str, str]]:
    out = []
    for rel, turns in EXPECTED["turns"].items():
        if rel.startswith(host + "/"):
            out.extend((e["turnId"], e["project"], e["seq"], e["completedAt"], host) for e in turns)
    return sorted(out)


def as_records(records: list[Stored]) -> list[tuple[str, str, int | None, str, str]]:
    return sorted(
        (r.turn.turn_id, r.turn.project, r.turn.seq, format_rfc3339(r.turn.completed_at_micros), r.turn.host)
        for r in records
    )


def records_now(bootstrap: str, topic: str) -> list[Stored]:
    """The topic's records, or none while the topic does not exist yet."""
    try:
        return read_topic(bootstrap, topic)
    except AssertionError:
        return []


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


# ---------------------------------------------------------------------------------------------- one-shot


def test_claude_code_history_becomes_the_expected_chains_and_reimport_changes_nothing(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    root = tmp_path / "projects"
    shutil.copytree(FIXTURES / "claude-code" / "projects", root)
    result = cli(kafka_bootstrap, kafka_topic_name, "ingest", "--format", "claude-code", str(root))
    assert result.returncode == 0, result.stderr
    bad = root / "-work-app" / "c1a1e000-0000-4000-8000-000000000001.jsonl"
    assert f"{bad}:19: invalid_json: " in result.stderr  # the corrupt line, by file and line
    assert "ingested 13 turns from 4 claude-code session files" in result.stderr
    records = read_topic(kafka_bootstrap, kafka_topic_name)
    assert as_records(records) == expected_records("claude-code")
    assert chains(records) == expected_chains("claude-code")
    again = cli(kafka_bootstrap, kafka_topic_name, "ingest", "--format", "claude-code", str(root))
    assert again.returncode == 0, again.stderr
    assert chains(read_topic(kafka_bootstrap, kafka_topic_name)) == expected_chains("claude-code")


def test_codex_default_root_with_a_state_sends_each_turn_once(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    home = tmp_path / "codex-home"
    shutil.copytree(FIXTURES / "codex", home)
    state = tmp_path / "codex.state"
    first = cli(
        kafka_bootstrap, kafka_topic_name, "ingest", "--format", "codex", "--state", str(state), CODEX_HOME=str(home)
    )
    assert first.returncode == 0, first.stderr
    records = read_topic(kafka_bootstrap, kafka_topic_name)
    assert as_records(records) == expected_records("codex")
    assert chains(records) == expected_chains("codex")
    second = cli(
        kafka_bootstrap, kafka_topic_name, "ingest", "--format", "codex", "--state", str(state), CODEX_HOME=str(home)
    )
    assert second.returncode == 0, second.stderr
    assert "ingested 0 turns" in second.stderr
    assert len(read_topic(kafka_bootstrap, kafka_topic_name)) == len(records)


def test_the_projected_chain_reads_back_as_the_conversation(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    root = FIXTURES / "claude-code" / "projects" / "-work-other"
    assert cli(kafka_bootstrap, kafka_topic_name, "ingest", "--format", "claude-code", str(root)).returncode == 0
    db = str(tmp_path / "p.duckdb")
    projected = cli(kafka_bootstrap, kafka_topic_name, "project", "--until-caught-up", "--db", db)
    assert projected.returncode == 0, projected.stderr
    read = cli(kafka_bootstrap, kafka_topic_name, "read", "--project", "/work/other", "--db", db)
    assert read.returncode == 0, read.stderr
    doc = json.loads(read.stdout)
    assert doc["status"] == "ok"
    assert [t["seq"] for t in doc["turns"]] == [1, 2]
    assert "Plan the migration." in doc["turns"][0]["body"] and "Column added." in doc["turns"][1]["body"]


# ---------------------------------------------------------------------------------------------- follow


def claude_line(kind: str, uuid: str, parent: str | None, text: str, session: str = "live-1") -> str:
    base = {
        "uuid": uuid,
        "parentUuid": parent,
        "sessionId": session,
        "cwd": "/work/live",
        "timestamp": "2026-05-01T00:00:00Z",
    }
    if kind == "user":
        return json.dumps({**base, "type": "user", "message": {"role": "user", "content": text}}) + "\n"
    return (
        json.dumps(
            {
                **base,
                "type": "assistant",
                "message": {"id": f"m-{uuid}", "content": [{"type": "text", "text": text}], "stop_reason": "end_turn"},
            }
        )
        + "\n"
    )


def test_follow_picks_up_growing_and_new_sessions_and_resumes(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    root = tmp_path / "projects" / "-work-live"
    root.mkdir(parents=True)
    state = tmp_path / "follow.state"
    session = root / "live-1.jsonl"
    session.write_text(claude_line("user", "u1", None, "first?"))
    argv = [
        CLI,
        "ingest",
        "--format",
        "claude-code",
        str(tmp_path / "projects"),
        "--follow",
        "--state",
        str(state),
        "--poll-interval",
        "0.05",
    ]
    proc = subprocess.Popen(argv, env=env_for(kafka_bootstrap, kafka_topic_name), stderr=subprocess.PIPE, text=True)
    try:
        reply = claude_line("assistant", "a1", "u1", "first.")
        with open(session, "a") as f:
            f.write(reply[:20])  # the host is writing the line
            f.flush()
            time.sleep(0.5)
            f.write(reply[20:])
        (root / "live-2.jsonl").write_text(
            claude_line("user", "v1", None, "other?", "live-2")
            + claude_line("assistant", "b1", "v1", "other.", "live-2")
        )
        wait_for(lambda: len(records_now(kafka_bootstrap, kafka_topic_name)) == 2, "both turns")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 0, err
    with open(session, "a") as f:
        f.write(claude_line("user", "u2", "a1", "second?") + claude_line("assistant", "a2", "u2", "second."))
    resumed = cli(
        kafka_bootstrap,
        kafka_topic_name,
        "ingest",
        "--format",
        "claude-code",
        str(tmp_path / "projects"),
        "--follow",
        "--state",
        str(state),
        "--max-idle",
        "3",
        "--poll-interval",
        "0.05",
    )  # > ENDED_TURN_QUIET
    assert resumed.returncode == 0, resumed.stderr
    records = read_topic(kafka_bootstrap, kafka_topic_name)
    assert sorted((r.turn.thread, r.turn.turn_id, r.turn.seq) for r in records) == [
        ("live-1", "u1", 1),
        ("live-1", "u2", 2),
        ("live-2", "v1", 1),
    ]


# ---------------------------------------------------------------------------------------------- hook


def test_claude_code_hook_appends_new_turns_once_and_survives_a_broker_outage(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    transcript = tmp_path / "s.jsonl"
    transcript.write_text(claude_line("user", "u1", None, "q1") + claude_line("assistant", "a1", "u1", "r1"))
    payload = json.dumps(
        {
            "session_id": "live-1",
            "transcript_path": str(transcript),
            "cwd": "/work/live",
            "hook_event_name": "Stop",
            "stop_hook_active": False,
        }
    )
    hook = ["hook", "claude-code", "--state-dir", str(tmp_path / "hooks")]
    first = cli(kafka_bootstrap, kafka_topic_name, *hook, stdin=payload)
    assert (first.returncode, first.stdout) == (0, ""), first.stderr
    assert [r.turn.turn_id for r in read_topic(kafka_bootstrap, kafka_topic_name)] == ["u1"]
    again = cli(kafka_bootstrap, kafka_topic_name, *hook, stdin=payload)
    assert again.returncode == 0, again.stderr
    assert len(read_topic(kafka_bootstrap, kafka_topic_name)) == 1  # nothing new: nothing sent
    # the next turn ends while the broker is unreachable: bounded, exit 1 (never 2), nothing on stdout
    with open(transcript, "a") as f:
        f.write(claude_line("user", "u2", "a1", "q2") + claude_line("assistant", "a2", "u2", "r2"))
    started = time.monotonic()
    down = cli(f"127.0.0.1:{closed_port()}", kafka_topic_name, *hook, "--timeout", "4", stdin=payload)
    assert time.monotonic() - started < 15
    assert (down.returncode, down.stdout) == (1, ""), down.stderr
    assert json.loads(down.stderr.strip().splitlines()[-1])["error"]["code"] in ("broker_unavailable", "hook_timeout")
    # the turn after that catches up with the one left behind
    with open(transcript, "a") as f:
        f.write(claude_line("user", "u3", "a2", "q3") + claude_line("assistant", "a3", "u3", "r3"))
    caught_up = cli(kafka_bootstrap, kafka_topic_name, *hook, stdin=payload)
    assert caught_up.returncode == 0, caught_up.stderr
    records = read_topic(kafka_bootstrap, kafka_topic_name)
    assert [(r.turn.turn_id, r.turn.seq) for r in records] == [("u1", 1), ("u2", 2), ("u3", 3)]
    # a bad payload or a missing transcript is exit 1 too, and a bad flag is never exit 2
    assert cli(kafka_bootstrap, kafka_topic_name, *hook, stdin="{not json").returncode == 1
    missing = json.dumps({"transcript_path": str(tmp_path / "nope.jsonl")})
    assert cli(kafka_bootstrap, kafka_topic_name, *hook, stdin=missing).returncode == 1
    assert cli(kafka_bootstrap, kafka_topic_name, *hook, "--no-such-flag", stdin=payload).returncode == 1


def test_codex_hook_from_the_stop_payload_and_from_notify(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    home = tmp_path / "codex-home"
    shutil.copytree(FIXTURES / "codex", home)
    rollout = next((home / "sessions").rglob("rollout-*0001.jsonl"))
    stop = json.dumps(
        {
            "session_id": "019a0000-0000-7000-8000-000000000001",
            "transcript_path": str(rollout),
            "cwd": "/work/svc",
            "hook_event_name": "Stop",
            "turn_id": "t-4",
            "stop_hook_active": False,
        }
    )
    hook = ["hook", "codex", "--state-dir", str(tmp_path / "hooks")]
    result = cli(kafka_bootstrap, kafka_topic_name, *hook, stdin=stop, CODEX_HOME=str(home))
    assert (result.returncode, result.stdout) == (0, ""), result.stderr
    # t-3 was interrupted (turn_aborted): a turn too, with turn.outcome interrupted
    assert [r.turn.turn_id for r in read_topic(kafka_bootstrap, kafka_topic_name)] == ["t-1", "t-2", "t-3", "t-4"]
    notify = json.dumps(
        {
            "type": "agent-turn-complete",
            "thread-id": "019a0000-0000-7000-8000-000000000002",
            "turn-id": "b-5",
            "cwd": "/work/svc",
            "input-messages": ["Three, in lib."],
            "last-assistant-message": "3 in lib",
        }
    )
    # notify = ["throughline", "hook", "codex"]: Codex appends its JSON as the last argument
    result = cli(kafka_bootstrap, kafka_topic_name, *hook, notify, CODEX_HOME=str(home))
    assert result.returncode == 0, result.stderr
    ids = [r.turn.turn_id for r in read_topic(kafka_bootstrap, kafka_topic_name) if r.turn.thread.endswith("0002")]
    assert sorted(ids) == ["b-1", "b-2", "b-3", "b-4", "b-5"]
