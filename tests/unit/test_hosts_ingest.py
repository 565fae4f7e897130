"""Following host session files (many files, one loop) and resuming from the sessions state.

The broker is the in-memory sender of test_ingest_reader: these tests are about which lines are read,
which turns are sent and what the state covers; tests/integration/test_hosts.py runs the real broker.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

from test_ingest_reader import FakeSender

from throughline.producers.ingest import Ingest
from throughline.producers.ingest.sessions import SessionDecoder, SessionFiles, SessionsState
from throughline.producers.ingest.state import load_session_states

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"


def prompt(uuid: str, text: str, parent: str | None, session: str = "S", cwd: str = "/w") -> bytes:
    return (
        json.dumps(
            {
                "type": "user",
                "uuid": uuid,
                "parentUuid": parent,
                "sessionId": session,
                "cwd": cwd,
                "timestamp": "2026-01-01T00:00:00Z",
                "message": {"role": "user", "content": text},
            }
        ).encode()
        + b"\n"
    )


def reply(uuid: str, text: str, parent: str, session: str = "S") -> bytes:
    return (
        json.dumps(
            {
                "type": "assistant",
                "uuid": uuid,
                "parentUuid": parent,
                "sessionId": session,
                "timestamp": "2026-01-01T00:00:01Z",
                "message": {"id": f"m-{uuid}", "content": [{"type": "text", "text": text}], "stop_reason": "end_turn"},
            }
        ).encode()
        + b"\n"
    )


def run(
    files: SessionFiles,
    sender: FakeSender,
    state: str | None = None,
    saved: dict | None = None,
    max_idle: float | None = None,
) -> tuple[Ingest, SessionDecoder]:
    decoder = SessionDecoder(files, warn=lambda m: None)
    ingest = Ingest(
        files,
        sender,
        state_path=state,
        decoder=decoder,
        max_idle=max_idle,
        err=io.StringIO(),
        state=SessionsState(state, files, saved or {}) if state else None,
    )
    return ingest, decoder


def sent_ids(sender: FakeSender) -> list[str]:
    return [p.turn.turn_id for p in sender.sent]


def test_one_shot_reads_every_session_and_resumes_without_sending_again(tmp_path: Path) -> None:
    # settle=0: every file is final (an end_turn message at a file's end ends its turn only then)
    root = tmp_path / "projects"
    shutil.copytree(FIXTURES / "claude-code" / "projects", root)
    state = str(tmp_path / "state.json")
    sender = FakeSender()
    ingest, decoder = run(SessionFiles("claude-code", [str(root)], settle=0.0), sender, state)
    ingest.run()
    assert len(sender.sent) == 13 and decoder.skipped == 1  # the corrupt line, reported with file and line
    saved = load_session_states(state, format="claude-code")
    assert len(saved) == 4
    # again: nothing new is sent, and the unchanged files are not even read
    again = FakeSender()
    files = SessionFiles("claude-code", [str(root)], states=saved, settle=0.0)
    ingest, _ = run(files, again, state, saved)
    ingest.run()
    assert again.sent == []
    read = sorted(Path(t.path).name for t in files.tracked.values() if t.parser is not None)
    assert read == ["c1a1e000-0000-4000-8000-000000000004.jsonl"]  # only the one with a partial last line
    # a new turn in one file: only it is sent (the file is parsed again, its old turns skipped)
    path = root / "-work-app" / "c1a1e000-0000-4000-8000-000000000004.jsonl"
    with open(path, "ab") as f:
        f.write(
            b"\n"
            + prompt("w-u3", "Third?", "w-a2", "c1a1e000-0000-4000-8000-000000000004")
            + reply("w-a3", "Yes, third.", "w-u3", "c1a1e000-0000-4000-8000-000000000004")
        )
    third = FakeSender()
    saved = load_session_states(state, format="claude-code")
    ingest, _ = run(SessionFiles("claude-code", [str(root)], states=saved, settle=0.0), third, state, saved)
    ingest.run()
    assert sent_ids(third) == ["w-u2", "w-u3"]  # w-u2 completed once its last line got its newline


def test_following_many_files_keeps_none_open_and_picks_up_new_ones(tmp_path: Path) -> None:
    root = tmp_path / "projects"
    for i in range(300):
        d = root / f"p{i % 7}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"s{i}.jsonl").write_bytes(prompt(f"u{i}", "q", None, f"s{i}") + reply(f"a{i}", "r", f"u{i}", f"s{i}"))
    files = SessionFiles("claude-code", [str(root)], follow=True, poll_interval=0.01, rescan_interval=0.0, settle=0.0)
    sender = FakeSender()
    ingest, _ = run(files, sender)
    fds_before = len(os.listdir("/proc/self/fd"))
    lines = list(files.lines())
    for line in lines:
        ingest._handle(line)
    assert len([ln for ln in lines if not ln.settle]) == 600 and len(sender.sent) == 300
    assert len(os.listdir("/proc/self/fd")) <= fds_before  # every file closed again after its read
    # a new session appears, an old one grows with a partial line, one is deleted
    (root / "p0" / "new.jsonl").write_bytes(prompt("n1", "new?", None, "new") + reply("n2", "yes", "n1", "new"))
    with open(root / "p1" / "s1.jsonl", "ab") as f:
        f.write(prompt("u1b", "more", "a1", "s1") + reply("a1b", "done", "u1b", "s1")[:-5])
    os.unlink(root / "p2" / "s2.jsonl")
    list(files.check_file())
    for line in files.lines():
        ingest._handle(line)
    assert sent_ids(sender)[300:] == ["n1"]  # the partial last line waits for its newline
    assert str(root / "p2" / "s2.jsonl") not in files.tracked
    with open(root / "p1" / "s1.jsonl", "ab") as f:
        f.write(reply("a1b", "done", "u1b", "s1")[-5:])
    for line in files.lines():
        ingest._handle(line)
    assert sent_ids(sender)[301:] == ["u1b"]


def test_a_replaced_or_truncated_file_is_read_again_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(prompt("u1", "one", None) + reply("a1", "1", "u1"))
    files = SessionFiles("claude-code", [str(path)], follow=True, poll_interval=0.01, settle=0.0)
    sender = FakeSender()
    ingest, _ = run(files, sender)
    for line in files.lines():
        ingest._handle(line)
    replacement = tmp_path / "s.tmp"
    replacement.write_bytes(prompt("v1", "other", None) + reply("b1", "2", "v1"))
    os.replace(replacement, path)  # a new inode under the same name
    for line in files.lines():
        ingest._handle(line)
    path.write_bytes(prompt("w1", "three", None))  # truncated in place
    for line in files.lines():
        ingest._handle(line)
    with open(path, "ab") as f:
        f.write(reply("c1", "3", "w1"))
    for line in files.lines():
        ingest._handle(line)
    seqs = [(p.turn.turn_id, p.turn.seq) for p in sender.sent]
    assert seqs == [("u1", 1), ("v1", 1), ("w1", 1)]  # each new content starts a fresh parse


def test_a_huge_tool_output_line_is_read_and_not_rendered(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    big = (
        json.dumps(
            {
                "type": "user",
                "uuid": "r",
                "parentUuid": "t",
                "sessionId": "S",
                "timestamp": "2026-01-01T00:00:00Z",
                "toolUseResult": {},
                "message": {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "x", "content": "y" * 5_000_000}],
                },
            }
        ).encode()
        + b"\n"
    )
    tool = (
        json.dumps(
            {
                "type": "assistant",
                "uuid": "t",
                "parentUuid": "u1",
                "sessionId": "S",
                "timestamp": "2026-01-01T00:00:00Z",
                "message": {
                    "id": "m",
                    "content": [{"type": "tool_use", "id": "x", "name": "Bash", "input": {"command": "cat big"}}],
                },
            }
        ).encode()
        + b"\n"
    )
    path.write_bytes(prompt("u1", "cat it", None) + tool + big + reply("a", "It is big.", "r"))
    sender = FakeSender()
    ingest, decoder = run(SessionFiles("claude-code", [str(path)], settle=0.0), sender)
    ingest.run()
    (turn,) = [p.turn for p in sender.sent]
    assert decoder.skipped == 0 and "- Bash: cat big" in turn.body and "yyyy" not in turn.body
