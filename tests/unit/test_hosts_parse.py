"""The host transcript parsers (pure): fixtures, expected chains, prefix stability, re-import, bodies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from throughline.core.fold import Append, ChainBook, Duplicate
from throughline.core.turn import MAX_BODY_BYTES, build_turn, format_rfc3339
from throughline.producers.exceptions import TranscriptLineError
from throughline.producers.hosts import HostTurn, new_parser, render_body, session_files
from throughline.producers.hosts.claude_code import ClaudeCodeSession
from throughline.producers.hosts.codex import CodexSession
from throughline.producers.hosts.files import default_roots, default_thread

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())


def parse_file(fmt: str, path: Path | str, *, lines: list[bytes] | None = None) -> list[HostTurn]:
    """Every turn of a file read as a one-shot ingest of a final file reads it (complete lines, then settled)."""
    parser = new_parser(fmt, str(path))
    data = Path(path).read_bytes().split(b"\n")[:-1] if lines is None else lines
    return feed_all(parser, data) + parser.settle()


def feed_all(parser: ClaudeCodeSession | CodexSession, lines: list[bytes]) -> list[HostTurn]:
    """The turns ``lines`` (numbered from 1) complete, skipping the lines the parser refuses."""
    out: list[HostTurn] = []
    for n, raw in enumerate(lines, 1):
        try:
            out.extend(parser.feed(n, raw))
        except TranscriptLineError:
            pass
    return out


def record(t: HostTurn) -> Any:
    return build_turn(
        project=t.project,
        host=t.host,
        thread=t.thread,
        turn_id=t.turn_id,
        completed_at_micros=t.completed_at_micros,
        body=t.body,
        seq=t.seq,
        attributes=t.attributes,
    )


def fold(turns: list[HostTurn], book: ChainBook | None = None) -> tuple[ChainBook, list[Any]]:
    book = book or ChainBook()
    outcomes = [book.apply(record(t), 0, i) for i, t in enumerate(turns)]
    return book, outcomes


def chain_ids(book: ChainBook) -> dict[tuple[str, str, str], list[str]]:
    return {
        (ts[0].record.host, ts[0].record.thread, ts[0].record.project): [t.turn_id for t in ts]
        for ts in book.live.values()
        if ts
    }


# ---------------------------------------------------------------------------------------------- fixtures


@pytest.mark.parametrize("relpath", sorted(EXPECTED["turns"]))
def test_each_fixture_yields_the_expected_turns(relpath: str) -> None:
    fmt = relpath.split("/")[0]
    path = FIXTURES / relpath
    turns = parse_file(fmt, path)
    thread = default_thread(fmt, str(path))
    got = [(t.seq, t.turn_id, t.project, format_rfc3339(t.completed_at_micros), t.thread, t.host) for t in turns]
    want = [(e["seq"], e["turnId"], e["project"], e["completedAt"], thread, fmt) for e in EXPECTED["turns"][relpath]]
    assert got == want


def all_fixture_turns() -> list[HostTurn]:
    out: list[HostTurn] = []
    for fmt in ("claude-code", "codex"):
        for path in session_files(fmt, str(FIXTURES / fmt)):
            out.extend(parse_file(fmt, path))
    return out


def test_the_fixtures_fold_into_the_expected_chains_and_reimport_adds_nothing() -> None:
    turns = all_fixture_turns()
    book, outcomes = fold(turns)
    assert all(isinstance(o, Append) for o in outcomes), book.quarantined
    want = {(c["host"], c["thread"], c["project"]): c["turnIds"] for c in EXPECTED["chains"]}
    assert chain_ids(book) == want
    _, again = fold(turns, book)
    assert all(isinstance(o, Duplicate) for o in again)
    assert chain_ids(book) == want


def test_folder_search_leaves_out_subagents_and_non_session_files() -> None:
    claude = [Path(p).name for p in session_files("claude-code", str(FIXTURES / "claude-code"))]
    assert "agent-abc.jsonl" not in claude and len(claude) == 4
    codex = [Path(p).name for p in session_files("codex", str(FIXTURES / "codex"))]
    assert "notes.jsonl" not in codex and all(n.startswith("rollout-") for n in codex) and len(codex) == 3
    explicit = FIXTURES / "codex" / "sessions" / "2026" / "01" / "03" / "notes.jsonl"
    assert session_files("codex", str(explicit)) == [str(explicit)]  # a file named explicitly is taken


def test_default_roots_follow_the_hosts_variables(tmp_path: Path) -> None:
    assert default_roots("claude-code", {"CLAUDE_CONFIG_DIR": "/cfg"}) == ["/cfg/projects"]
    (tmp_path / "archived_sessions").mkdir()
    assert default_roots("codex", {"CODEX_HOME": str(tmp_path)}) == [
        str(tmp_path / "sessions"),
        str(tmp_path / "archived_sessions"),
    ]
    assert default_roots("claude-code", {})[0].endswith("/.claude/projects")


def test_a_corrupt_line_changes_nothing_else() -> None:
    path = FIXTURES / "claude-code" / "projects" / "-work-app" / "c1a1e000-0000-4000-8000-000000000001.jsonl"
    lines = path.read_bytes().split(b"\n")[:-1]
    clean = [ln for ln in lines if b'"uuid":"broken"' not in ln]
    assert len(clean) == len(lines) - 1
    strip = lambda ts: [(t.turn_id, t.seq, t.body, t.completed_at_micros) for t in ts]  # noqa: E731
    assert strip(parse_file("claude-code", path, lines=clean)) == strip(parse_file("claude-code", path))
    with pytest.raises(TranscriptLineError) as info:
        ClaudeCodeSession("s").feed(1, b'{"type":"user",')
    assert info.value.code == "invalid_json"


def test_non_utf8_bytes_and_lone_surrogates_become_replacement_text() -> None:
    p = ClaudeCodeSession("s")
    p.feed(
        1,
        json.dumps(
            {
                "type": "user",
                "uuid": "u",
                "sessionId": "s",
                "cwd": "/w",
                "timestamp": "2026-01-01T00:00:00Z",
                "message": {"role": "user", "content": "bad \ud800 surrogate"},
            }
        ).encode(),
    )
    raw = json.dumps(
        {
            "type": "assistant",
            "uuid": "a",
            "parentUuid": "u",
            "sessionId": "s",
            "timestamp": "2026-01-01T00:00:01Z",
            "message": {"id": "m", "content": [{"type": "text", "text": "x YY y"}], "stop_reason": "end_turn"},
        }
    )
    assert p.feed(2, raw.encode().replace(b"YY", b"\xc3\x28")) == []  # its message may have more blocks
    (turn,) = p.settle()
    assert "bad ? surrogate" in turn.body and "x \ufffd( y" in turn.body
    record(turn)  # a valid turn


def test_a_multi_block_message_written_as_cumulative_snapshots_is_rendered_once() -> None:
    p = ClaudeCodeSession("s")
    base = {"sessionId": "s", "cwd": "/w", "timestamp": "2026-01-01T00:00:00Z"}
    p.feed(1, json.dumps({**base, "type": "user", "uuid": "u", "message": {"role": "user", "content": "hi"}}).encode())
    one = [{"type": "text", "text": "part one"}]
    two = [*one, {"type": "text", "text": "part two"}]
    p.feed(
        2,
        json.dumps(
            {
                **base,
                "type": "assistant",
                "uuid": "a1",
                "parentUuid": "u",
                "message": {"id": "m", "content": one, "stop_reason": None},
            }
        ).encode(),
    )
    p.feed(
        3,
        json.dumps(
            {
                **base,
                "type": "assistant",
                "uuid": "a2",
                "parentUuid": "a1",
                "message": {"id": "m", "content": two, "stop_reason": "end_turn"},
            }
        ).encode(),
    )
    (turn,) = p.feed(4, json.dumps({**base, "type": "system", "subtype": "turn_duration", "uuid": "d"}).encode())
    assert turn.body.endswith("## Reply\n\npart one\n\npart two")


# ---------------------------------------------------------------------------------------------- bodies


def test_a_body_within_the_limit_is_rendered_whole() -> None:
    body, attributes = render_body("Why?", ["Bash: ls"], "Because.")
    assert body == "## Prompt\n\nWhy?\n\n## Tool calls\n\n- Bash: ls\n\n## Reply\n\nBecause."
    assert attributes == {}


@given(
    prompt=st.text(min_size=0, max_size=300),
    reply=st.text(min_size=0, max_size=300),
    tools=st.lists(st.text(max_size=40), max_size=30),
    limit=st.integers(min_value=200, max_value=2000),
)
@settings(max_examples=200, deadline=None)
def test_a_cut_body_fits_the_limit_at_a_character_boundary_and_says_so(
    prompt: str, reply: str, tools: list[str], limit: int
) -> None:
    body, attributes = render_body(prompt, tools, reply, limit=limit)
    size = len(body.encode("utf-8"))
    assert size <= limit
    full, none = render_body(prompt, tools, reply, limit=10**9)
    assert none == {}
    if attributes:
        assert attributes["ingest.bodyTruncated"] == "true"
        assert int(attributes["ingest.bodyBytes"]) == len(full.encode("utf-8")) > limit
        assert body.startswith("## Prompt\n\n") and "## Reply\n\n" in body
    else:
        assert body == full
    assert render_body(prompt, tools, reply, limit=limit) == (body, attributes)  # deterministic


def test_a_huge_prompt_keeps_the_reply_and_the_turn() -> None:
    body, attributes = render_body("é" * MAX_BODY_BYTES, [], "the answer")
    assert len(body.encode("utf-8")) <= MAX_BODY_BYTES
    assert body.endswith("## Reply\n\nthe answer") and "[… cut:" in body
    assert attributes["ingest.bodyTruncated"] == "true"


# ---------------------------------------------------------------------------------------------- properties


def claude_lines(actions: list[tuple[str, int]]) -> list[bytes]:
    """A Claude Code transcript from generated actions (prompts, replies, rewinds, noise)."""
    out: list[bytes] = []
    uuids: list[str] = []
    last: str | None = None
    for i, (kind, arg) in enumerate(actions):
        uid = f"x{i}"
        ts = f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z"
        base = {"sessionId": "S", "cwd": f"/w/{arg % 2}", "timestamp": ts, "uuid": uid}
        parent = last
        if kind == "rewind" and uuids:
            parent = uuids[arg % len(uuids)]
        if kind in ("prompt", "rewind"):
            entry = {**base, "type": "user", "parentUuid": parent, "message": {"role": "user", "content": f"q{i}"}}
        elif kind in ("reply", "end"):
            entry = {
                **base,
                "type": "assistant",
                "parentUuid": parent,
                "message": {
                    "id": f"m{arg % 3}",
                    "content": [{"type": "text", "text": f"r{i}"}],
                    "stop_reason": "end_turn" if kind == "end" else None,
                },
            }
        elif kind == "tool":
            entry = {
                **base,
                "type": "assistant",
                "parentUuid": parent,
                "message": {
                    "id": f"t{i}",
                    "content": [{"type": "tool_use", "id": f"tu{i}", "name": "Bash", "input": {"command": "ls"}}],
                },
            }
        elif kind == "duration":
            entry = {**base, "type": "system", "subtype": "turn_duration", "parentUuid": parent}
        elif kind == "meta":
            entry = {
                **base,
                "type": "user",
                "parentUuid": parent,
                "isMeta": True,
                "message": {"role": "user", "content": "ctx"},
            }
        elif kind == "side":
            entry = {
                **base,
                "type": "user",
                "isSidechain": True,
                "parentUuid": parent,
                "message": {"role": "user", "content": "s"},
            }
        else:  # corrupt
            out.append(b'{"type": "assistant", "mess')
            continue
        out.append(json.dumps(entry).encode())
        if kind != "side":
            uuids.append(uid)
            last = uid
    return out


CLAUDE_ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["prompt", "prompt", "reply", "end", "tool", "duration", "rewind", "meta", "side", "corrupt"]),
        st.integers(min_value=0, max_value=50),
    ),
    max_size=40,
)


def codex_lines(actions: list[tuple[str, int]]) -> list[bytes]:
    out: list[dict[str, Any]] = [{"type": "session_meta", "payload": {"id": "T", "cwd": "/c"}}]
    for i, (kind, arg) in enumerate(actions):
        if kind == "turn":
            out += [
                {"type": "event_msg", "payload": {"type": "task_started", "turn_id": f"t{i}"}},
                {"type": "turn_context", "payload": {"cwd": f"/c/{arg % 2}"}},
                {"type": "event_msg", "payload": {"type": "user_message", "message": f"q{i}"}},
                {"type": "event_msg", "payload": {"type": "agent_message", "message": f"a{i}"}},
                {
                    "type": "event_msg",
                    "payload": {"type": "task_complete" if arg % 4 else "turn_aborted", "turn_id": f"t{i}"},
                },
            ]
        elif kind == "rollback":
            out.append({"type": "event_msg", "payload": {"type": "thread_rolled_back", "num_turns": arg % 4 + 1}})
        else:
            out.append({"type": "event_msg", "payload": {"type": "token_count", "info": None}})
    # The host's clock moves forward line by line (it wrapped at 60 lines here once, which the fold's
    # re-send rule is entitled to read as a clock stepped back across a rollback:
    # docs/design.md, "Re-ingesting with a newer parser (implemented)", its known limits).
    return [
        json.dumps({"timestamp": f"2026-01-01T00:{n // 60:02d}:{n % 60:02d}Z", **e}).encode() for n, e in enumerate(out)
    ]


CODEX_ACTIONS = st.lists(
    st.tuples(st.sampled_from(["turn", "turn", "turn", "rollback", "noise"]), st.integers(min_value=0, max_value=50)),
    max_size=30,
)


@given(actions=CLAUDE_ACTIONS, cut=st.integers(min_value=0, max_value=60))
# A rewind onto a turn an earlier rewind superseded (found by a random run: seq 4 after a chain of 2).
@example(actions=[("prompt", 0)] * 4 + [("rewind", 0), ("prompt", 0), ("rewind", 2), ("prompt", 0)], cut=0)
# A rewind onto the turn the first rewind abandoned while it was open.
@example(actions=[("prompt", 0)] * 4 + [("rewind", 0), ("prompt", 0), ("rewind", 3), ("prompt", 0)], cut=0)
@settings(max_examples=300, deadline=None)
def test_claude_code_turns_are_prefix_stable_and_fold_without_a_reject(
    actions: list[tuple[str, int]], cut: int
) -> None:
    lines = claude_lines(actions)
    full = feed_all(ClaudeCodeSession("S"), lines)
    prefix = feed_all(ClaudeCodeSession("S"), lines[:cut])
    assert full[: len(prefix)] == prefix  # a hook at any line boundary agrees with a later follower
    book, outcomes = fold(full)
    assert all(isinstance(o, Append) for o in outcomes), book.quarantined
    _, again = fold(full, book)  # re-importing the file
    assert all(isinstance(o, Duplicate) for o in again)


@given(actions=CODEX_ACTIONS, cut=st.integers(min_value=0, max_value=160))
@settings(max_examples=300, deadline=None)
def test_codex_turns_are_prefix_stable_and_rollbacks_rewind_soundly(actions: list[tuple[str, int]], cut: int) -> None:
    lines = codex_lines(actions)
    full = feed_all(CodexSession("T"), lines)
    prefix = feed_all(CodexSession("T"), lines[:cut])
    assert full[: len(prefix)] == prefix
    book, outcomes = fold(full)
    assert all(isinstance(o, Append) for o in outcomes), book.quarantined
    _, again = fold(full, book)
    assert all(isinstance(o, Duplicate) for o in again)
