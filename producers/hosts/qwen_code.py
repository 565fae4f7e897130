"""Qwen Code sessions (``~/.qwen/projects/<project>/chats/<session>.jsonl``) as completed turns (pure).

Qwen Code records a session as Claude Code does (one JSON object a line, a ``uuid``/``parentUuid`` tree,
``sessionId``, ``cwd``, ``timestamp``, ``type``), but its ``message`` is a Gemini API ``Content``
(``role``, ``parts``: ``text``, ``thought``, ``functionCall``, ``functionResponse``, ``inlineData``),
tool results are lines of their own (``type: "tool_result"``) and host-written records carry a
``subtype``. ``QwenCodeSession`` is ``ClaudeCodeSession`` fed each line translated to Claude Code's
shape (``claude_entry``), so the turn, rewind and outcome rules are the same (docs/hosts.md):

- a human prompt is a ``user`` line without ``subtype`` whose ``provenance`` (where written) is
  ``real_user``, not a sidechain (subagent) line; its text parts are the prompt (``[image]`` for inline
  data); turnId = its ``promptId`` or else its ``uuid``; project = its ``cwd``;
- an ``assistant`` line is one message (its ``uuid``): text parts (not ``thought``) are the reply,
  ``functionCall`` parts are tool calls waiting for a ``tool_result`` line's ``functionResponse``
  (matched by ``id``; guess: a call without ``id`` waits for nothing);
- every other line (``system`` records: compression, slash commands, telemetry, notifications, rewinds,
  ``turn_result``) only carries the tree along. A rewind is a new prompt whose ``parentUuid`` points
  into an earlier turn, as in Claude Code.

Qwen Code writes no ``stop_reason`` (guess, from its ``ChatRecord`` type): a turn ends at the next
human prompt that continues from it, or at ``settle()`` (the ``Stop`` hook, or a file that stopped
growing) once its last message has a reply and no tool call waits; outcome ``answered``, else
``interrupted``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from throughline.producers.hosts.adapter import HostAdapter
from throughline.producers.hosts.builtin import home
from throughline.producers.hosts.claude_code import ClaudeCodeSession
from throughline.producers.hosts.lines import SessionParser
from throughline.producers.hosts.render import HostTurn

__all__ = ["HOST", "QwenCodeHost", "QwenCodeSession", "claude_entry"]

HOST = "qwen-code"
#: ``provenance`` values of a line a person wrote (absent on older records: then every plain user line).
_HUMAN_PROVENANCE = (None, "real_user")


def _parts(entry: Mapping[str, Any]) -> list[Any]:
    message = entry.get("message")
    parts = message.get("parts") if isinstance(message, Mapping) else None
    return parts if isinstance(parts, list) else []


def _text_blocks(parts: list[Any]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for part in parts:
        if not isinstance(part, Mapping) or part.get("thought"):
            continue
        if isinstance(part.get("text"), str):
            blocks.append({"type": "text", "text": part["text"]})
        elif isinstance(part.get("inlineData"), Mapping) or isinstance(part.get("fileData"), Mapping):
            blocks.append({"type": "image"})
    return blocks


def claude_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A Qwen Code line in Claude Code's shape (the fields ``ClaudeCodeSession`` reads)."""
    kind = entry.get("type")
    out: dict[str, Any] = {
        k: entry[k] for k in ("uuid", "parentUuid", "sessionId", "cwd", "timestamp", "promptId") if k in entry
    }
    if entry.get("isSidechain") or entry.get("agentId"):
        out["isSidechain"] = True
    parts = _parts(entry)
    if kind == "user":
        human = not entry.get("subtype") and entry.get("provenance") in _HUMAN_PROVENANCE
        out.update(type="user", message={"role": "user", "content": _text_blocks(parts)})
        if not human:
            out["isMeta"] = True  # a host-written user line: context, never a prompt
        return out
    if kind == "assistant":
        blocks = _text_blocks(parts)
        for part in parts:
            call = part.get("functionCall") if isinstance(part, Mapping) else None
            if isinstance(call, Mapping):
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call.get("id"),
                        "name": call.get("name"),
                        "input": call.get("args"),
                    }
                )
        message_id = entry.get("uuid")
        out.update(type="assistant", message={"role": "assistant", "id": message_id, "content": blocks})
        return out
    if kind == "tool_result":
        results = []
        for part in parts:
            response = part.get("functionResponse") if isinstance(part, Mapping) else None
            if isinstance(response, Mapping) and isinstance(response.get("id"), str):
                results.append({"type": "tool_result", "tool_use_id": response["id"]})
        call = entry.get("toolCallResult")
        if not results and isinstance(call, Mapping) and isinstance(call.get("callId"), str):
            results.append({"type": "tool_result", "tool_use_id": call["callId"]})
        out.update(type="user", toolUseResult=True, message={"role": "user", "content": results})
        return out
    out["type"] = "system"  # carries the tree (uuid/parentUuid) along and nothing else
    return out


class QwenCodeSession(ClaudeCodeSession):
    """The turns of one Qwen Code session file: ``ClaudeCodeSession`` over translated lines."""

    host = HOST

    def take(self, number: int, entry: dict[str, Any]) -> list[HostTurn]:
        """The turns one parsed line completes."""
        return [_as_qwen(t) for t in super().take(number, claude_entry(entry))]

    def settle(self, final: bool = False) -> list[HostTurn]:
        """The open turn, when the file is final and the model had answered it."""
        return [_as_qwen(t) for t in super().settle(final)]


def _as_qwen(turn: HostTurn) -> HostTurn:
    return replace(turn, host=HOST, attributes={**turn.attributes, "ingest.format": HOST})


class QwenCodeHost(HostAdapter):
    """Qwen Code's ``~/.qwen/projects/<project>/chats/<session>.jsonl`` sessions."""

    name = HOST
    summary = "Qwen Code sessions (~/.qwen/projects/*/chats)"
    hook_event = "Stop"

    def default_roots(self, environ: Mapping[str, str]) -> list[str]:
        """``$QWEN_HOME/projects`` (guess: ``~/.qwen/projects`` unless ``QWEN_HOME`` says otherwise)."""
        return [os.path.join(home(environ, "QWEN_HOME", ".qwen"), "projects")]

    def is_session_file(self, path: str) -> bool:
        """``*.jsonl`` files in a ``chats`` folder (guess: anything else under projects is not a session)."""
        return path.endswith(".jsonl") and os.path.basename(os.path.dirname(path)) == "chats"

    def skip_folder(self, name: str) -> bool:
        """``subagents`` folders (guess, as Claude Code: a subagent's own conversation)."""
        return name == "subagents"

    def new_parser(self, path: str) -> SessionParser:
        """A ``QwenCodeSession`` whose thread defaults to the file name (the session id)."""
        return QwenCodeSession(self.default_thread(path))
