"""The hosts added as adapters, end to end against a real broker: ``ingest --format`` from each host's
default root, ``--follow`` on a growing session (an OpenCode store, rows), and each host's hook run from a
shell exactly as the host runs it (its JSON on standard input).

Fixtures: tests/fixtures/hosts/adapters (expected.json: each session's turns).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.opencode_store import add_message, build_store, open_store
from support.opencode_tree import message_file
from support.topic import Stored, read_topic
from test_hosts import CLI, RUN_TIMEOUT_S, chains, cli, env_for, records_now, wait_for

from throughline.core.turn import parse_rfc3339

ADAPTED = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "adapters"
EXPECTED = json.loads((ADAPTED / "expected.json").read_text())


def home_of(host: str, tmp: Path) -> tuple[dict[str, str], Path]:
    """The host's fixture placed under a home of its own: (environment, the session's path there)."""
    if host == "qwen-code":
        shutil.copytree(ADAPTED / "qwen-code", tmp / "qwen")
        return {"QWEN_HOME": str(tmp / "qwen")}, tmp / "qwen" / EXPECTED["sessions"][host].split("/", 1)[1]
    if host == "gemini-cli":
        shutil.copytree(ADAPTED / "gemini-cli" / "tmp", tmp / "home" / ".gemini" / "tmp")
        rel = EXPECTED["sessions"][host].split("/", 1)[1]
        return {"GEMINI_CLI_HOME": str(tmp / "home")}, tmp / "home" / ".gemini" / rel
    if host == "copilot-cli":
        shutil.copytree(ADAPTED / "copilot-cli", tmp / "copilot")
        rel = EXPECTED["sessions"][host].split("/", 1)[1]
        return {"COPILOT_HOME": str(tmp / "copilot")}, tmp / "copilot" / rel
    store = tmp / "data" / "opencode" / "opencode.db"
    store.parent.mkdir(parents=True)
    build_store(store, ADAPTED / EXPECTED["sessions"]["opencode"])
    return {"XDG_DATA_HOME": str(tmp / "data")}, store


def sent(records: list[Stored]) -> list[list[object]]:
    return [
        [
            r.turn.turn_id,
            r.turn.seq,
            r.turn.producer.attributes.get("turn.outcome"),
            r.turn.completed_at_micros,
        ]
        for r in records
    ]


def expected_records(host: str) -> list[list[object]]:
    return [[t, s, o, parse_rfc3339(c)] for t, s, o, c in EXPECTED["turns"][host]]


def live_chain(host: str) -> list[str]:
    chain: list[str] = []
    for turn_id, seq, _, _ in EXPECTED["turns"][host]:
        del chain[seq - 1 :]
        chain.append(turn_id)
    return chain


@pytest.mark.parametrize("host", ["qwen-code", "gemini-cli", "copilot-cli", "opencode"])
def test_a_host_is_ingested_from_its_default_root_and_again_without_sending_twice(
    host: str, kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    env, _ = home_of(host, tmp_path)
    state = str(tmp_path / "state.json")
    first = cli(kafka_bootstrap, kafka_topic_name, "ingest", "--format", host, "--state", state, **env)
    assert first.returncode == 0, first.stderr
    records = read_topic(kafka_bootstrap, kafka_topic_name)
    assert sorted(sent(records)) == sorted(expected_records(host))
    assert {r.turn.host for r in records} == {host} and {r.turn.project for r in records} == {
        EXPECTED["projects"][host]
    }
    assert [ids for ids in chains(records).values()] == [live_chain(host)]
    again = cli(kafka_bootstrap, kafka_topic_name, "ingest", "--format", host, "--state", state, **env)
    assert again.returncode == 0, again.stderr
    assert "ingested 0 turns" in again.stderr
    assert len(read_topic(kafka_bootstrap, kafka_topic_name)) == len(records)


@pytest.mark.parametrize("host", ["qwen-code", "gemini-cli", "copilot-cli"])
def test_follow_picks_up_a_growing_session(
    host: str, kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    env, session = home_of(host, tmp_path)
    lines = session.read_bytes().splitlines(keepends=True)
    session.write_bytes(b"".join(lines[:3]))  # the session has just begun
    argv = [
        CLI,
        "ingest",
        "--format",
        host,
        "--follow",
        "--state",
        str(tmp_path / "f.state"),
        "--poll-interval",
        "0.05",
    ]
    proc = subprocess.Popen(
        argv, env=env_for(kafka_bootstrap, kafka_topic_name, **env), stderr=subprocess.PIPE, text=True
    )
    try:
        time.sleep(1.0)
        for line in lines[3:]:
            with open(session, "ab") as f:
                f.write(line)
            time.sleep(0.02)
        want = len(EXPECTED["turns"][host])
        wait_for(lambda: len(records_now(kafka_bootstrap, kafka_topic_name)) >= want, f"{want} {host} turns")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 0, err
    assert sorted(sent(read_topic(kafka_bootstrap, kafka_topic_name))) == sorted(expected_records(host))


def test_follow_polls_an_opencode_store_while_it_is_written_and_takes_a_revert_as_a_rewind(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    env, store = home_of("opencode", tmp_path)
    argv = [
        CLI,
        "ingest",
        "--format",
        "opencode",
        "--follow",
        "--state",
        str(tmp_path / "f.state"),
        "--poll-interval",
        "0.05",
    ]
    proc = subprocess.Popen(
        argv, env=env_for(kafka_bootstrap, kafka_topic_name, **env), stderr=subprocess.PIPE, text=True
    )
    writer = open_store(store)  # OpenCode's own connection stays open and writing while ingest reads
    try:
        wait_for(lambda: len(records_now(kafka_bootstrap, kafka_topic_name)) == 3, "the store's three turns")
        base = 1777629600000
        user = {"role": "user", "time": {"created": base + 40_000}}
        add_message(
            writer,
            {
                "id": "msg_10",
                "session": "ses_1",
                "created": base + 40_000,
                "data": user,
                "parts": [{"id": "prt_20", "data": {"type": "text", "text": "Add a test."}}],
            },
        )
        streaming = {"role": "assistant", "parentID": "msg_10", "time": {"created": base + 41_000}}
        add_message(
            writer,
            {
                "id": "msg_11",
                "session": "ses_1",
                "created": base + 41_000,
                "data": streaming,
                "parts": [{"id": "prt_21", "data": {"type": "text", "text": "Writing"}}],
            },
        )
        time.sleep(0.5)
        assert len(records_now(kafka_bootstrap, kafka_topic_name)) == 3  # still streaming: not a turn yet
        done = {**streaming, "time": {"created": base + 41_000, "completed": base + 42_000}, "finish": "stop"}
        writer.execute(
            "UPDATE message SET data = ?, time_updated = ? WHERE id = 'msg_11'",
            (json.dumps(done), base + 42_000),
        )
        writer.execute(
            "UPDATE part SET data = ?, time_updated = ? WHERE id = 'prt_21'",
            (json.dumps({"type": "text", "text": "Added tests/test_x.py."}), base + 42_000),
        )
        wait_for(lambda: len(records_now(kafka_bootstrap, kafka_topic_name)) == 4, "the fourth turn")
        # /undo back to before msg_06, then a new prompt: OpenCode deletes the reverted messages
        writer.execute(
            "DELETE FROM part WHERE message_id IN ('msg_06', 'msg_07', 'msg_08', 'msg_09', 'msg_10', 'msg_11')"
        )
        writer.execute("DELETE FROM message WHERE id IN ('msg_06', 'msg_07', 'msg_08', 'msg_09', 'msg_10', 'msg_11')")
        add_message(
            writer,
            {
                "id": "msg_12",
                "session": "ses_1",
                "created": base + 50_000,
                "data": {"role": "user", "time": {"created": base + 50_000}},
                "parts": [{"id": "prt_22", "data": {"type": "text", "text": "Explain it briefly."}}],
            },
        )
        add_message(
            writer,
            {
                "id": "msg_13",
                "session": "ses_1",
                "created": base + 51_000,
                "data": {
                    "role": "assistant",
                    "parentID": "msg_12",
                    "finish": "stop",
                    "time": {"created": base + 51_000, "completed": base + 52_000},
                },
                "parts": [{"id": "prt_23", "data": {"type": "text", "text": "Parsing and printing are apart."}}],
            },
        )
        wait_for(lambda: len(records_now(kafka_bootstrap, kafka_topic_name)) == 5, "the turn after the revert")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        writer.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 0, err
    records = read_topic(kafka_bootstrap, kafka_topic_name)
    assert [(r.turn.turn_id, r.turn.seq) for r in records if r.turn.turn_id in ("msg_10", "msg_12")] == [
        ("msg_10", 4),
        ("msg_12", 3),
    ]
    assert list(chains(records).values()) == [["msg_01", "msg_04", "msg_12"]]


def test_an_opencode_json_tree_is_ingested_from_the_default_root_and_followed_through_a_revert(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    # the data folder of an OpenCode of 2025: both layouts of its JSON tree, no SQLite store yet
    shutil.copytree(ADAPTED / "opencode-tree", tmp_path / "data" / "opencode")
    env = {"XDG_DATA_HOME": str(tmp_path / "data")}
    state = str(tmp_path / "state.json")
    first = cli(kafka_bootstrap, kafka_topic_name, "ingest", "--format", "opencode", "--state", state, **env)
    assert first.returncode == 0, first.stderr
    records = read_topic(kafka_bootstrap, kafka_topic_name)
    assert sorted(sent(records)) == sorted(expected_records("opencode"))
    assert {r.turn.project for r in records} == {EXPECTED["projects"]["opencode"]}
    again = cli(kafka_bootstrap, kafka_topic_name, "ingest", "--format", "opencode", "--state", state, **env)
    assert again.returncode == 0, again.stderr
    assert "ingested 0 turns" in again.stderr
    storage = tmp_path / "data" / "opencode" / "storage"
    argv = [CLI, "ingest", "--format", "opencode", "--follow", "--state", state, "--poll-interval", "0.05"]
    proc = subprocess.Popen(
        argv, env=env_for(kafka_bootstrap, kafka_topic_name, **env), stderr=subprocess.PIPE, text=True
    )
    base = 1777629600000

    def msg(mid: str, second: int, role: str, text: str, **data: object) -> dict[str, object]:
        body = {"role": role, "time": {"created": base + second * 1000}, **data}
        parts = [{"id": f"prt_{mid}", "data": {"type": "text", "text": text}}]
        return {"id": mid, "session": "ses_1", "created": base + second * 1000, "data": body, "parts": parts}

    try:
        time.sleep(1.0)
        message_file(storage, msg("msg_10", 40, "user", "Add a test."))
        message_file(storage, msg("msg_11", 41, "assistant", "Writing", parentID="msg_10"))  # streaming
        time.sleep(0.5)
        assert len(records_now(kafka_bootstrap, kafka_topic_name)) == 3  # still streaming: not a turn yet
        done = {"time": {"created": base + 41_000, "completed": base + 42_000}, "finish": "stop"}
        message_file(storage, msg("msg_11", 41, "assistant", "Added tests/test_x.py.", parentID="msg_10", **done))
        wait_for(lambda: len(records_now(kafka_bootstrap, kafka_topic_name)) == 4, "the fourth turn")
        # /undo back to before msg_06, then a new prompt: OpenCode deletes the reverted messages' files
        for mid in ("msg_06", "msg_07", "msg_08", "msg_09", "msg_10", "msg_11"):
            (storage / "message" / "ses_1" / f"{mid}.json").unlink()
            shutil.rmtree(storage / "part" / mid, ignore_errors=True)
        message_file(storage, msg("msg_12", 50, "user", "Explain it briefly."))
        reply = {"time": {"created": base + 51_000, "completed": base + 52_000}, "finish": "stop"}
        message_file(storage, msg("msg_13", 51, "assistant", "Parsing and printing are apart.", **reply))
        wait_for(lambda: len(records_now(kafka_bootstrap, kafka_topic_name)) == 5, "the turn after the revert")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 0, err
    records = read_topic(kafka_bootstrap, kafka_topic_name)
    assert [(r.turn.turn_id, r.turn.seq) for r in records if r.turn.turn_id in ("msg_10", "msg_12")] == [
        ("msg_10", 4),
        ("msg_12", 3),
    ]
    assert list(chains(records).values()) == [["msg_01", "msg_04", "msg_12"]]


HOOK_PAYLOADS = {
    # Claude-Code-style Stop (Qwen Code), AfterAgent (Gemini CLI), agentStop's camelCase input (Copilot CLI)
    "qwen-code": lambda s: {
        "session_id": "5f0c0000-0000-4000-8000-0000000000a1",
        "transcript_path": str(s),
        "cwd": "/work/qwen",
        "hook_event_name": "Stop",
        "stop_hook_active": False,
    },
    "gemini-cli": lambda s: {
        "session_id": "9a1e0000-0000-4000-8000-0000000000b1",
        "transcript_path": str(s),
        "cwd": "/work/gemini",
        "hook_event_name": "AfterAgent",
        "timestamp": "2026-05-01T10:00:26Z",
        "prompt": "Thanks.",
        "prompt_response": "",
        "stop_hook_active": False,
    },
    "copilot-cli": lambda s: {
        "sessionId": "c0b10000-0000-4000-8000-0000000000c1",
        "timestamp": 1777629625000,
        "cwd": "/work/copilot",
        "stopReason": "end_turn",
        "stopHookActive": False,
    },
}


@pytest.mark.parametrize("host", sorted(HOOK_PAYLOADS))
def test_the_hook_runs_from_a_shell_as_the_host_runs_it(
    host: str, kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    env, session = home_of(host, tmp_path)
    payload = json.dumps(HOOK_PAYLOADS[host](session))
    command = f"{CLI} hook {host} --wait 0.2 --state-dir {tmp_path / 'hooks'}"
    run = subprocess.run(
        ["sh", "-c", command],
        input=payload,
        env=env_for(kafka_bootstrap, kafka_topic_name, **env),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    # nothing on stdout: the hosts read a decision there
    assert (run.returncode, run.stdout) == (0, ""), run.stderr
    assert sorted(sent(read_topic(kafka_bootstrap, kafka_topic_name))) == sorted(expected_records(host))
    bad = subprocess.run(
        ["sh", "-c", command],
        input="{not json",
        env=env_for(kafka_bootstrap, kafka_topic_name, **env),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    # never 2: each of these hosts reads 2 as "block" or "retry"
    assert (bad.returncode, bad.stdout) == (1, "")


def test_gemini_sessions_of_earlier_versions_are_read_whole_and_followed_as_they_are_rewritten(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    shutil.copytree(ADAPTED / "gemini-cli-legacy" / "tmp", home / ".gemini" / "tmp")
    document = home / ".gemini" / "tmp" / "old-proj" / "chats" / "session-2025-11-01T09-00-0ld0c0de.json"
    env = {"GEMINI_CLI_HOME": str(home)}
    argv = [CLI, "ingest", "--format", "gemini-cli", "--follow", "--state", str(tmp_path / "f.state")]
    proc = subprocess.Popen(
        [*argv, "--poll-interval", "0.05"],
        env=env_for(kafka_bootstrap, kafka_topic_name, **env),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # the .json and the .jsonl it was converted to when resumed: the .json of that one is left out
        wait_for(
            lambda: len(records_now(kafka_bootstrap, kafka_topic_name)) >= 2,
            "the first turn of both sessions",
        )
        doc = json.loads(document.read_text())
        doc["messages"].append(
            {"id": "old-u3", "timestamp": "2025-11-01T09:03:00.000Z", "type": "user", "content": "Thanks."}
        )
        document.write_text(json.dumps(doc, indent=2) + "\n")  # gemini-cli rewrote the whole file
        wait_for(
            lambda: any(
                r.turn.turn_id == "old-u2" and r.turn.thread.startswith("0ld")
                for r in records_now(kafka_bootstrap, kafka_topic_name)
            ),
            "the turn the rewrite completed",
        )
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 0, err
    records = read_topic(kafka_bootstrap, kafka_topic_name)
    got = {(r.turn.thread[:4], r.turn.turn_id, r.turn.seq, r.turn.project) for r in records}
    assert ("0ld0", "old-u1", 1, "/work/gemini-old") in got and (
        "c0nv",
        "old-u1",
        1,
        "/work/gemini-old",
    ) in got
    assert ("0ld0", "old-u2", 2, "/work/gemini-old") in got
    assert got <= {(t, u, s, "/work/gemini-old") for t in ("0ld0", "c0nv") for u, s in (("old-u1", 1), ("old-u2", 2))}
