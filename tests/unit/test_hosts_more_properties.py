"""Hypothesis properties of the Gemini CLI, Copilot CLI, OpenCode and Qwen Code parsers over random
sessions drawn from each host's record kinds: no record raises, the turns of every prefix are the first
turns of the whole, every outcome is valid, and no turn's seq skips past its chain's tip."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from throughline.producers.hosts.registry import adapter
from throughline.testing.hosts import OUTCOMES, parse_records, turn_key

IDS = st.sampled_from(["a", "b", "c", "d", "e", "f"])
SECONDS = st.integers(0, 59)
TEXT = st.sampled_from(["", "  ", "hello", "/model", "<session_context>x", "done."])


def ts(second: int) -> str:
    return f"2026-05-01T10:00:{second:02d}Z"


@st.composite
def gemini_records(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["user", "gemini", "gemini", "info", "error", "rewind", "set", "meta"]))
    mid = draw(IDS)
    if kind == "rewind":
        return {"$rewindTo": mid}
    if kind == "set":
        return {"$set": {"messages": [{"id": draw(IDS) + "s", "type": "user", "content": "summary"}]}}
    if kind == "meta":
        return {"sessionId": "S", "projectHash": "h"}
    record: dict[str, Any] = {"id": mid, "timestamp": ts(draw(SECONDS)), "type": kind, "content": draw(TEXT)}
    if kind == "gemini" and draw(st.booleans()):
        status = draw(st.sampled_from(["executing", "success", "cancelled"]))
        record["toolCalls"] = [{"id": "c" + draw(IDS), "name": "read_file", "args": {}, "status": status}]
    return record


@st.composite
def copilot_records(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(
        st.sampled_from(
            [
                "session.start",
                "user.message",
                "assistant.message",
                "tool.execution_start",
                "tool.execution_complete",
                "assistant.turn_end",
                "abort",
                "session.error",
                "session.context_changed",
            ]
        )
    )
    call = "t" + draw(IDS)
    data: dict[str, Any] = {
        "session.start": {"sessionId": "S", "context": {"cwd": "/a"}},
        "user.message": {
            "content": draw(TEXT),
            **({"source": "skill"} if draw(st.booleans()) and False else {}),
        },
        "assistant.message": {
            "messageId": "m",
            "content": draw(TEXT),
            "toolRequests": [{"toolCallId": call, "name": "bash"}] if draw(st.booleans()) else [],
        },
        "tool.execution_start": {"toolCallId": call, "toolName": "bash"},
        "tool.execution_complete": {"toolCallId": call, "success": True},
        "assistant.turn_end": {"turnId": "0"},
        "abort": {"reason": "user_initiated"},
        "session.error": {"errorType": "x", "message": "y"},
        "session.context_changed": {"cwd": draw(st.sampled_from(["/a", "/b"]))},
    }[kind]
    return {"type": kind, "data": data, "id": draw(IDS) + draw(IDS), "timestamp": ts(draw(SECONDS))}


@st.composite
def opencode_records(draw: st.DrawFn) -> dict[str, Any]:
    session = {"id": "ses", "directory": "/oc", "parent_id": None}
    if draw(st.integers(0, 9)) == 0:
        return {"session": session, "removed": draw(st.lists(IDS, max_size=2))}
    role = draw(st.sampled_from(["user", "assistant", "assistant"]))
    parts: list[dict[str, Any]] = [{"type": "text", "text": draw(TEXT), "synthetic": draw(st.booleans())}]
    message: dict[str, Any] = {
        "id": draw(IDS),
        "role": role,
        "time": {"created": 1777629600000 + draw(SECONDS) * 1000},
    }
    if role == "assistant":
        message["time"]["completed"] = message["time"]["created"] + 500
        choice = draw(st.sampled_from(["stop", "tool-calls", "error", "summary"]))
        if choice == "error":
            message["error"] = {"name": draw(st.sampled_from(["MessageAbortedError", "APIError"]))}
        elif choice == "summary":
            message.update(summary=True, finish="stop")
        else:
            message["finish"] = choice
        if draw(st.booleans()):
            parts.append(
                {
                    "type": "tool",
                    "callID": "c" + draw(IDS),
                    "tool": "bash",
                    "state": {"status": draw(st.sampled_from(["running", "completed"])), "input": {}},
                }
            )
    return {"session": session, "message": message, "parts": parts}


@st.composite
def qwen_records(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["user", "assistant", "assistant", "tool_result", "system"]))
    uuid = draw(IDS) + draw(IDS)
    parent = draw(st.one_of(st.none(), IDS.map(lambda i: i + i)))
    parts: list[dict[str, Any]] = [{"text": draw(TEXT)}]
    if kind == "assistant" and draw(st.booleans()):
        parts.append({"functionCall": {"id": "k" + draw(IDS), "name": "ls", "args": {}}})
    if kind == "tool_result":
        parts = [{"functionResponse": {"id": "k" + draw(IDS), "response": {}}}]
    record = {
        "sessionId": "S",
        "cwd": "/q",
        "timestamp": ts(draw(SECONDS)),
        "type": kind,
        "uuid": uuid,
        "parentUuid": parent,
        "message": {"role": "user", "parts": parts},
    }
    if kind == "user" and draw(st.integers(0, 3)) == 0:
        record["subtype"] = "notification"
    return record


HOSTS = {
    "gemini-cli": (gemini_records(), "/x/proj/chats/session-1.jsonl"),
    "copilot-cli": (copilot_records(), "/x/s/events.jsonl"),
    "opencode": (opencode_records(), "/x/opencode.db#ses"),
    "qwen-code": (qwen_records(), "/x/chats/S.jsonl"),
}


def check(host: str, entries: list[dict[str, Any]]) -> None:
    records = [json.dumps(e).encode() for e in entries]
    path = HOSTS[host][1]
    host_adapter = adapter(host)
    whole = [turn_key(t) for t in parse_records(host_adapter, path, records, settle=False)]
    for cut in range(len(records)):
        prefix = [turn_key(t) for t in parse_records(host_adapter, path, records[:cut], settle=False)]
        assert prefix == whole[: len(prefix)]
    settled = parse_records(host_adapter, path, records)
    assert [turn_key(t) for t in settled][: len(whole)] == whole
    tips: dict[tuple[str, str], int] = {}
    for t in settled:
        assert t.attributes["turn.outcome"] in OUTCOMES
        assert t.seq <= tips.get((t.thread, t.project), 0) + 1
        tips[(t.thread, t.project)] = t.seq


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.lists(gemini_records(), max_size=25))
def test_gemini_cli_sessions(entries: list[dict[str, Any]]) -> None:
    check("gemini-cli", entries)


@SETTINGS
@given(st.lists(copilot_records(), max_size=25))
def test_copilot_cli_sessions(entries: list[dict[str, Any]]) -> None:
    check("copilot-cli", entries)


@SETTINGS
@given(st.lists(opencode_records(), max_size=25))
def test_opencode_sessions(entries: list[dict[str, Any]]) -> None:
    check("opencode", entries)


@SETTINGS
@given(st.lists(qwen_records(), max_size=25))
def test_qwen_code_sessions(entries: list[dict[str, Any]]) -> None:
    check("qwen-code", entries)
