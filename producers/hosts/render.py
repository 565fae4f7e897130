"""A completed host turn and its body: one deterministic rendering for every host (pure; no I/O).

The body of a turn read from a host's transcript is::

    ## Prompt

    <the human prompt>

    ## Tool calls

    - Bash: ls -la
    - Read: /src/app.py

    ## Reply

    <the final reply>

The tool-call section is left out when the turn made none. Each tool line is the tool's name and its
main argument (the first of ``command``, ``cmd``, ``file_path``, ``path``, ``pattern``, ``url``,
``query``, ``description``, ``prompt``; else the arguments as compact JSON), whitespace folded, cut to
``TOOL_LINE_CHARS`` characters. Tool outputs are never rendered.

A rendering over ``MAX_BODY_BYTES`` is cut, never dropped: tool lines beyond ``TOOL_SECTION_BYTES``
become one ``- … N more tool calls`` line, then the prompt and the reply share what is left (the
shorter keeps all of itself up to half, the longer takes the rest), each cut at a character boundary
and marked ``[… cut: N of M bytes]``. The turn then carries ``ingest.bodyTruncated=true`` and
``ingest.bodyBytes`` (the full rendering's length) in ``producer.attributes``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from throughline.core.turn import MAX_BODY_BYTES

TOOL_LINE_CHARS = 200
TOOL_SECTION_BYTES = 16 * 1024
#: ``producer.attributes`` key of how a host turn ended: ``answered``, ``interrupted`` or ``aborted``.
OUTCOME_ATTRIBUTE = "turn.outcome"
_MAIN_ARGUMENTS = ("command", "cmd", "file_path", "path", "pattern", "url", "query", "description", "prompt")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class HostTurn:
    """One completed turn read from a host transcript, ready to be built into a ``TurnRecord``."""

    host: str
    thread: str
    project: str
    turn_id: str
    completed_at_micros: int
    body: str
    seq: int
    line: int  # the transcript line that completed the turn
    attributes: Mapping[str, str] = field(default_factory=dict)


def clean_text(text: str) -> str:
    """``text`` as valid Unicode: a lone surrogate (a JSON ``\\ud800`` escape) becomes ``?``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def tool_line(name: object, arguments: object) -> str:
    """The one-line summary of a tool call: ``name: main argument``."""
    label = clean_text(name) if isinstance(name, str) and name else "tool"
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    summary: str
    if isinstance(arguments, Mapping):
        summary = ""
        for key in _MAIN_ARGUMENTS:
            value = arguments.get(key)
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                value = " ".join(value)
            if isinstance(value, str) and value.strip():
                summary = value
                break
        if not summary:
            summary = json.dumps(arguments, sort_keys=True, ensure_ascii=False, default=str)
    elif isinstance(arguments, str):
        summary = arguments
    elif arguments is None:
        summary = ""
    else:
        summary = json.dumps(arguments, sort_keys=True, ensure_ascii=False, default=str)
    summary = _SPACE.sub(" ", clean_text(summary)).strip()
    if len(summary) > TOOL_LINE_CHARS:
        summary = summary[: TOOL_LINE_CHARS - 1] + "…"
    return f"{label}: {summary}" if summary else label


def _compose(prompt: str, tools: Sequence[str], reply: str) -> str:
    parts = ["## Prompt\n\n", prompt, "\n\n"]
    if tools:
        parts.append("## Tool calls\n\n")
        parts.extend(f"- {t}\n" for t in tools)
        parts.append("\n")
    parts.extend(["## Reply\n\n", reply])
    return "".join(parts)


def _cut(text: str, budget: int) -> str:
    """``text`` cut to at most ``budget`` UTF-8 bytes (marker included) at a character boundary."""
    data = text.encode("utf-8")
    if len(data) <= budget:
        return text
    marker = f"\n[… cut: {{}} of {len(data)} bytes]"
    keep = max(0, budget - len(marker.format(len(data)).encode("utf-8")))
    head = data[:keep].decode("utf-8", "ignore")
    return head + marker.format(len(head.encode("utf-8")))


def _cut_tools(tools: Sequence[str], budget: int) -> list[str]:
    kept: list[str] = []
    used = 0
    for i, line in enumerate(tools):
        size = len(line.encode("utf-8")) + 3
        if used + size > budget:
            kept.append(f"… {len(tools) - i} more tool calls")
            break
        kept.append(line)
        used += size
    return kept


def render_body(
    prompt: str, tools: Sequence[str], reply: str, *, limit: int = MAX_BODY_BYTES
) -> tuple[str, dict[str, str]]:
    """The body of a turn and the attributes that say whether (and from what length) it was cut."""
    prompt, reply = clean_text(prompt), clean_text(reply)
    tools = [clean_text(t) for t in tools]
    full = _compose(prompt, tools, reply)
    full_bytes = len(full.encode("utf-8"))
    if full_bytes <= limit:
        return full, {}
    tools = _cut_tools(tools, min(TOOL_SECTION_BYTES, limit // 4))
    frame = len(_compose("", tools, "").encode("utf-8"))
    room = max(0, limit - frame)
    p_len, r_len = len(prompt.encode("utf-8")), len(reply.encode("utf-8"))
    if p_len + r_len > room:
        half = room // 2
        if p_len <= r_len:
            p_budget = min(p_len, half)
            r_budget = room - p_budget
        else:
            r_budget = min(r_len, half)
            p_budget = room - r_budget
        prompt, reply = _cut(prompt, p_budget), _cut(reply, r_budget)
    body = _compose(prompt, tools, reply)
    # The markers' digits can only make a part shorter than its budget, never longer; this is a guard.
    while len(body.encode("utf-8")) > limit:  # pragma: no cover - defensive
        reply = _cut(reply, max(0, len(reply.encode("utf-8")) - 64))
        body = _compose(prompt, tools, reply)
    return body, {"ingest.bodyTruncated": "true", "ingest.bodyBytes": str(full_bytes)}


def finished_turn(
    host: str,
    *,
    thread: str,
    project: str,
    turn_id: str,
    seq: int,
    completed_at_micros: int,
    line: int,
    outcome: str,
    prompt: str,
    tools: Sequence[str],
    reply: str,
) -> HostTurn:
    """The ``HostTurn`` of a turn that ended at transcript ``line``: its body rendered, and the
    attributes every host turn carries (format, line, ``turn.outcome``, truncation)."""
    body, attributes = render_body(prompt, tools, reply)
    return HostTurn(
        host=host,
        thread=thread,
        project=project,
        turn_id=turn_id,
        completed_at_micros=completed_at_micros,
        body=body,
        seq=seq,
        line=line,
        attributes={
            "ingest.format": host,
            "ingest.line": str(line),
            OUTCOME_ATTRIBUTE: outcome,
            **attributes,
        },
    )


def text_of(value: Any) -> str:
    """Plain text of a string or a list of content blocks (``text``/``input_text``/``output_text``)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        return ""
    parts = []
    for block in value:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, Mapping):
            kind = block.get("type")
            text = block.get("text")
            if kind in ("text", "input_text", "output_text") and isinstance(text, str):
                parts.append(text)
            elif kind in ("image", "input_image", "localImage", "local_image"):
                parts.append("[image]")
    return "\n\n".join(parts)
