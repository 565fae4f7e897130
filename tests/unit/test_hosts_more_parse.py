"""Rules of the Gemini CLI, Copilot CLI, OpenCode and Qwen Code parsers that the fixtures do not show on
their own (docs/hosts.md, "More hosts")."""

from __future__ import annotations

import json
from typing import Any

from throughline.producers.hosts.registry import adapter
from throughline.producers.hosts.render import OUTCOME_ATTRIBUTE, HostTurn
from throughline.testing.hosts import parse_records


def turns(
    host: str,
    entries: list[dict[str, Any]],
    *,
    settle: bool = True,
    path: str = "/x/proj/chats/session-1.jsonl",
) -> list[HostTurn]:
    return parse_records(adapter(host), path, [json.dumps(e).encode() for e in entries], settle=settle)


def ids(ts: list[HostTurn]) -> list[tuple[str, int, str]]:
    return [(t.turn_id, t.seq, t.attributes[OUTCOME_ATTRIBUTE]) for t in ts]


# ------------------------------------------------------------------------------------------ gemini-cli


def g(mid: str, kind: str, second: int, content: Any = "", **extra: Any) -> dict[str, Any]:
    return {
        "id": mid,
        "timestamp": f"2026-05-01T10:00:{second:02d}Z",
        "type": kind,
        "content": content,
        **extra,
    }


META = {"sessionId": "S", "projectHash": "h"}


def test_gemini_a_prompt_or_an_old_message_written_again_changes_no_turn() -> None:
    entries = [
        META,
        g("u1", "user", 1, "one"),
        g("u1", "user", 1, "one, edited"),
        g("m1", "gemini", 2, "A1."),
        g("u2", "user", 3, "two"),
        g("m1", "gemini", 2, "A1 again."),
        g("m2", "gemini", 4, "A2."),
    ]
    got = turns("gemini-cli", entries)
    assert ids(got) == [("u1", 1, "answered"), ("u2", 2, "answered")]
    assert "one, edited" in got[0].body and "A1." in got[0].body and "A2." in got[1].body


def test_gemini_rewinds_within_the_open_turn_and_to_an_unknown_id() -> None:
    entries = [
        META,
        g("u1", "user", 1, "one"),
        g("m1", "gemini", 2, "first try"),
        {"$rewindTo": "m1"},
        g("m2", "gemini", 3, "second try"),
        g("u2", "user", 4, "two"),
        g("m3", "gemini", 5, "B."),
        {"$rewindTo": "no-such-message"},
        g("u3", "user", 6, "three"),
        g("m4", "gemini", 7, "C."),
    ]
    got = turns("gemini-cli", entries)
    assert ids(got) == [("u1", 1, "answered"), ("u3", 1, "answered")]  # u2 taken back; the chain cleared
    assert "second try" in got[0].body and "first try" not in got[0].body


def test_gemini_a_turn_ends_unanswered_while_a_tool_call_waits_and_aborted_after_an_error() -> None:
    call = {"id": "c", "name": "read_file", "args": {"path": "a"}, "status": "executing"}
    entries = [
        META,
        g("u1", "user", 1, "one"),
        g("m1", "gemini", 2, "Reading.", toolCalls=[call]),
        g("u2", "user", 3, "two"),
        g("e", "error", 4, "quota"),
        g("u3", "user", 5, "three"),
    ]
    assert ids(turns("gemini-cli", entries)) == [("u1", 1, "interrupted"), ("u2", 2, "aborted")]


def test_gemini_a_checkpoint_is_a_compression_not_a_rewind() -> None:
    summary = g("sum", "user", 5, "Summary of the conversation so far.")
    entries = [
        META,
        g("u1", "user", 1, "one"),
        g("m1", "gemini", 2, "A."),
        g("u2", "user", 3, "two"),
        g("m2", "gemini", 4, "B."),
        {"$set": {"messages": [summary, g("m2", "gemini", 4, "B.")]}},
        g("u3", "user", 6, "three"),
        g("m3", "gemini", 7, "C."),
        g("u4", "user", 8, "four"),
        g("m4", "gemini", 9, "D."),
        {"$rewindTo": "sum"},
        g("u5", "user", 10, "five"),
        g("m5", "gemini", 11, "E."),
    ]
    got = ids(turns("gemini-cli", entries))
    # the compression keeps u1 and u2; rewinding to its summary takes back u3 and u4 (open), so u5 is seq 3
    assert got == [("u1", 1, "answered"), ("u2", 2, "answered"), ("u3", 3, "answered"), ("u5", 3, "answered")]


def test_gemini_a_subagent_recording_has_no_turns() -> None:
    entries = [{**META, "kind": "subagent"}, g("u1", "user", 1, "task"), g("m1", "gemini", 2, "Done.")]
    assert turns("gemini-cli", entries) == []


# ----------------------------------------------------------------------------------------- copilot-cli


def c(kind: str, data: dict[str, Any], eid: str, second: int = 1, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "data": data, "id": eid, "timestamp": f"2026-05-01T10:00:{second:02d}Z", **extra}


START = c("session.start", {"sessionId": "S", "context": {"cwd": "/a"}}, "e0", 0)


def test_copilot_sub_agent_work_and_injected_messages_are_not_the_turn() -> None:
    entries = [
        START,
        c("user.message", {"content": "Go."}, "p1"),
        c(
            "assistant.message",
            {"messageId": "x", "content": "sub-agent says", "toolRequests": []},
            "e2",
            agentId="a-1",
        ),
        c("user.message", {"content": "agent prompt", "source": "agent-a-1"}, "e3"),
        c("assistant.message", {"messageId": "m", "content": "Main answer.", "toolRequests": []}, "e4", 4),
        c("assistant.turn_end", {"turnId": "0"}, "e5", 5),
    ]
    (got,) = turns("copilot-cli", entries, settle=False)
    assert (got.turn_id, got.completed_at_micros % 60_000_000) == ("p1", 4_000_000)
    assert "Main answer." in got.body and "sub-agent" not in got.body and "agent prompt" not in got.body


def test_copilot_an_error_before_the_next_prompt_is_aborted_and_the_cwd_follows_context_changes() -> None:
    entries = [
        START,
        c("user.message", {"content": "Go."}, "p1"),
        c("session.error", {"errorType": "quota", "message": "no"}, "e2"),
        c("session.context_changed", {"cwd": "/b"}, "e3"),
        c("user.message", {"content": "Again."}, "p2"),
        c("assistant.message", {"messageId": "m", "content": "Done.", "toolRequests": []}, "e5", 5),
        c("assistant.turn_end", {"turnId": "1"}, "e6", 6),
    ]
    got = turns("copilot-cli", entries)
    assert [(t.turn_id, t.project, t.attributes[OUTCOME_ATTRIBUTE]) for t in got] == [
        ("p1", "/a", "aborted"),
        ("p2", "/b", "answered"),
    ]


def test_copilot_seq_counts_the_turns_of_the_turns_own_project() -> None:
    def turn(n: int) -> list[dict[str, Any]]:
        return [
            c("user.message", {"content": f"q{n}"}, f"p{n}", n * 3),
            c(
                "assistant.message",
                {"messageId": f"m{n}", "content": f"r{n}", "toolRequests": []},
                f"a{n}",
                n * 3 + 1,
            ),
            c("assistant.turn_end", {"turnId": "0"}, f"e{n}", n * 3 + 2),
        ]

    entries = [
        START,
        *turn(1),
        c("session.context_changed", {"cwd": "/b"}, "x1"),
        *turn(2),
        c("session.context_changed", {"cwd": "/a"}, "x2"),
        *turn(3),
    ]
    got = turns("copilot-cli", entries)
    assert [(t.turn_id, t.project, t.seq) for t in got] == [("p1", "/a", 1), ("p2", "/b", 1), ("p3", "/a", 2)]


def test_copilot_a_tool_call_still_running_keeps_the_turn_open() -> None:
    entries = [
        START,
        c("user.message", {"content": "Go."}, "p1"),
        c(
            "assistant.message",
            {
                "messageId": "m",
                "content": "On it.",
                "toolRequests": [{"toolCallId": "t", "name": "bash", "arguments": {"command": "make"}}],
            },
            "e2",
        ),
        c("assistant.turn_end", {"turnId": "0"}, "e3"),
    ]
    assert turns("copilot-cli", entries) == []  # neither the turn_end nor settle() completes it


# -------------------------------------------------------------------------------------------- opencode


def o(mid: str, role: str, parts: list[dict[str, Any]], **data: Any) -> dict[str, Any]:
    return {
        "session": {"id": "ses", "directory": "/oc", "parent_id": None},
        "message": {
            "id": mid,
            "role": role,
            "time": {"created": 1777629600000, "completed": 1777629601000},
            **data,
        },
        "parts": parts,
    }


def text(t: str, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": t, **extra}


def test_opencode_a_compaction_inside_a_turn_neither_ends_nor_answers_it() -> None:
    entries = [
        o("m1", "user", [text("Long task.")]),
        o(
            "m2",
            "assistant",
            [
                {
                    "type": "tool",
                    "callID": "c",
                    "tool": "bash",
                    "state": {"status": "completed", "input": {"command": "make"}},
                }
            ],
            finish="tool-calls",
        ),
        o("m3", "user", [{"type": "compaction", "auto": True}]),
        o("m4", "assistant", [text("Summary of everything.")], finish="stop", summary=True),
        o("m5", "user", [text("Continue if you have next steps", synthetic=True)]),
        o("m6", "assistant", [text("Finished the task.")], finish="stop"),
    ]
    (got,) = turns("opencode", entries, path="/x/opencode.db#ses")
    assert got.turn_id == "m1" and "Finished the task." in got.body and "Summary" not in got.body
    assert "- bash: make" in got.body


# ------------------------------------------------------------------------------------------- qwen-code


def q(kind: str, uuid: str, parent: str | None, parts: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "sessionId": "S",
        "cwd": "/q",
        "timestamp": "2026-05-01T10:00:00Z",
        "type": kind,
        "uuid": uuid,
        "parentUuid": parent,
        "message": {"role": "model" if kind == "assistant" else "user", "parts": parts},
        **extra,
    }


def test_qwen_a_function_call_without_its_response_keeps_the_turn_open() -> None:
    call = {"functionCall": {"id": "k", "name": "run_shell_command", "args": {"command": "ls"}}}
    entries = [
        q("user", "u1", None, [{"text": "List."}]),
        q("assistant", "a1", "u1", [{"text": "Listing."}, call]),
    ]
    assert turns("qwen-code", entries) == []
    answered = [
        *entries,
        q("tool_result", "r1", "a1", [{"functionResponse": {"id": "k", "response": {}}}]),
        q("assistant", "a2", "r1", [{"text": "Two files."}]),
    ]
    (got,) = turns("qwen-code", answered)
    assert (got.host, got.turn_id, got.attributes["ingest.format"]) == ("qwen-code", "u1", "qwen-code")
    assert "- run_shell_command: ls" in got.body and got.body.endswith("Two files.")
