"""What a host's ``Stop`` hook needs beside the ingest loop: its payload, the transcript the payload names,
and a bounded wait for that transcript's last turn (the command is ``throughline.commands.hook``).

Claude Code writes the hook's JSON on stdin (``session_id``, ``transcript_path``, ``cwd``,
``hook_event_name``, ...); Codex's older ``notify`` program gets its JSON as the last argument instead
(``{"type": "agent-turn-complete", "thread-id", ...}``, no transcript path: the rollout is found by its
thread id under ``$CODEX_HOME/sessions``); every other host names its transcript through its adapter.
"""

from __future__ import annotations

import glob
import json
import os
import time
from typing import Any

from throughline.errors import InputError
from throughline.producers.exceptions import HookError
from throughline.producers.hosts.adapter import HookPayloadError
from throughline.producers.hosts.files import default_roots, new_parser
from throughline.producers.hosts.registry import adapter, adapters
from throughline.producers.ingest.sessions import (
    MAX_TRANSCRIPT_LINE_BYTES,
)
from throughline.producers.ingest.tail import LineReader

MAX_PAYLOAD_BYTES = 1024 * 1024


def default_state_dir() -> str:
    """``$XDG_STATE_HOME/throughline/hooks`` (``~/.local/state/throughline/hooks`` by default)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "throughline", "hooks")


def read_payload(argument: str | None, stdin: Any) -> dict[str, Any]:
    """The hook's JSON: the argument when given (Codex ``notify``), else standard input."""
    if argument is not None:
        text = argument
    else:
        if stdin is None or stdin.isatty():
            raise HookError("no hook payload: the host writes it on standard input")
        text = stdin.read(MAX_PAYLOAD_BYTES + 1)
        if len(text) > MAX_PAYLOAD_BYTES:
            raise HookError(f"the hook payload is over {MAX_PAYLOAD_BYTES} bytes")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise HookError(f"the hook payload is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise HookError("the hook payload is not a JSON object")
    return doc


def hook_hosts() -> tuple[str, ...]:
    """The hosts with a stop-like hook (``HostAdapter.hook_event``), from the host registry."""
    return tuple(name for name, host in adapters().items() if host.hook_event is not None)


def transcript_of(format: str, payload: dict[str, Any]) -> str:
    """The transcript a payload names (``transcript_path``; for Codex ``notify``, found by thread id)."""
    if format not in ("claude-code", "codex"):  # every other host says through its adapter
        try:
            return adapter(format).transcript_of(payload, os.environ)
        except HookPayloadError as exc:
            raise HookError(str(exc)) from None
    path = payload.get("transcript_path")
    if isinstance(path, str) and path:
        return os.path.abspath(os.path.expanduser(path))
    thread = payload.get("thread-id") or payload.get("thread_id") or payload.get("session_id")
    if format == "codex" and isinstance(thread, str) and thread and "/" not in thread:
        matches: list[str] = []
        for root in default_roots("codex"):
            matches.extend(
                glob.glob(
                    os.path.join(glob.escape(root), "**", f"rollout-*{glob.escape(thread)}.jsonl"), recursive=True
                )
            )
        if matches:
            return os.path.abspath(max(matches, key=lambda p: (os.path.getmtime(p), p)))
        raise HookError(f"no rollout of thread {thread} under {', '.join(default_roots('codex'))}")
    raise HookError("the hook payload names no transcript_path")


def wait_for_last_turn(format: str, path: str, wait: float) -> None:
    """Re-read the transcript until its last turn ends or ``wait`` seconds pass (bounded).

    A turn ends for the hook when a line ends it or when its reply is written with no tool call
    waiting (the host calls its Stop hook once the turn is written, so the hook settles it).
    """
    deadline = time.monotonic() + wait
    parser = new_parser(format, path)
    reader = LineReader(path, follow=True, max_line_bytes=MAX_TRANSCRIPT_LINE_BYTES)
    try:
        while True:
            for line in reader.lines():
                if line.too_long:
                    continue
                try:
                    parser.feed(line.number, line.data)
                except InputError:
                    pass
            if not parser.open_turn or parser.settle_ready or time.monotonic() >= deadline:
                return
            time.sleep(0.05)
    finally:
        reader.close()
