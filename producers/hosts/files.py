"""Where each host keeps its session files, and which files under a folder are sessions.

- Claude Code: ``$CLAUDE_CONFIG_DIR`` or ``~/.claude``; sessions are ``projects/<project>/<session>.jsonl``.
  Under a folder, every ``*.jsonl`` is a session except subagent transcripts (``agent-*.jsonl`` and
  anything under a ``subagents`` folder: their own conversations, left out) and ``history.jsonl``
  (the prompt history, no transcript).
- Codex: ``$CODEX_HOME`` or ``~/.codex``; sessions are ``sessions/YYYY/MM/DD/rollout-*.jsonl`` (and
  ``archived_sessions/rollout-*.jsonl``). Under a folder, every ``rollout-*.jsonl`` is a session.

A path given explicitly that is a file is a session file whatever its name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from throughline.producers.hosts.claude_code import ClaudeCodeSession
from throughline.producers.hosts.codex import CodexSession
from throughline.producers.hosts.lines import SessionParser

FORMATS = ("claude-code", "codex")
_UUID_TAIL = re.compile(r"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})$")



def default_roots(format: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """The folders searched when ``ingest --format FORMAT`` is given no PATH."""
    env = os.environ if environ is None else environ
    if format == "claude-code":
        home = env.get("CLAUDE_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".claude")
        return [os.path.join(home, "projects")]
    home = env.get("CODEX_HOME") or os.path.join(os.path.expanduser("~"), ".codex")
    roots = [os.path.join(home, "sessions")]
    archived = os.path.join(home, "archived_sessions")
    if os.path.isdir(archived):
        roots.append(archived)
    return roots


def is_session_name(format: str, name: str) -> bool:
    """Whether a file name found under a searched folder is one of the host's session files."""
    if not name.endswith(".jsonl"):
        return False
    if format == "claude-code":
        return not name.startswith("agent-") and name != "history.jsonl"
    return name.startswith("rollout-")


def session_files(format: str, root: str) -> list[str]:
    """The session files at ``root`` (itself when it is a file), sorted; none when it does not exist."""
    if os.path.isfile(root):
        return [root]
    found: list[str] = []
    for folder, subfolders, names in os.walk(root):
        subfolders.sort()
        if format == "claude-code":
            subfolders[:] = [d for d in subfolders if d != "subagents"]
        found.extend(os.path.join(folder, n) for n in sorted(names) if is_session_name(format, n))
    return found


def default_thread(format: str, path: str) -> str:
    """The thread of a file whose lines name none: its session id as the file name gives it."""
    stem = os.path.basename(path)
    stem = stem[: -len(".jsonl")] if stem.endswith(".jsonl") else stem
    if format == "codex":
        m = _UUID_TAIL.search(stem)
        if m:
            return m.group(1)
    return stem or "session"


def new_parser(format: str, path: str) -> SessionParser:
    """A fresh parser for one session file of ``format``."""
    thread = default_thread(format, path)
    if format == "claude-code":
        return ClaudeCodeSession(thread)
    if format == "codex":
        return CodexSession(thread)
    raise ValueError(f"unknown host format {format!r}")
