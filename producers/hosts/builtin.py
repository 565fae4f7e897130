"""The adapters of the first two hosts, Claude Code and Codex CLI (their parsers: ``claude_code``, ``codex``).

- Claude Code: ``$CLAUDE_CONFIG_DIR`` or ``~/.claude``; sessions are ``projects/<project>/<session>.jsonl``.
  Under a folder, every ``*.jsonl`` is a session except subagent transcripts (``agent-*.jsonl`` and
  anything under a ``subagents`` folder: their own conversations, left out) and ``history.jsonl``
  (the prompt history, no transcript). Hook: ``Stop``.
- Codex: ``$CODEX_HOME`` or ``~/.codex``; sessions are ``sessions/YYYY/MM/DD/rollout-*.jsonl`` (and
  ``archived_sessions/rollout-*.jsonl``). Under a folder, every ``rollout-*.jsonl`` is a session; its
  thread is the UUID that ends its name. Hook: ``Stop`` (and the older ``notify`` program, found by
  thread id; ``throughline.producers.hook``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from throughline.producers.hosts.adapter import HostAdapter
from throughline.producers.hosts.claude_code import ClaudeCodeSession
from throughline.producers.hosts.codex import CodexSession
from throughline.producers.hosts.lines import SessionParser

__all__ = ["ClaudeCodeHost", "CodexHost", "home"]

_UUID_TAIL = re.compile(r"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})$")


def home(environ: Mapping[str, str], variable: str, folder: str) -> str:
    """``$variable`` when set and not empty, else ``~/folder``."""
    return environ.get(variable) or os.path.join(os.path.expanduser("~"), folder)


class ClaudeCodeHost(HostAdapter):
    """Claude Code's ``~/.claude/projects/<project>/<session>.jsonl`` transcripts."""

    name = "claude-code"
    summary = "Claude Code transcripts (~/.claude/projects)"
    hook_event = "Stop"

    def default_roots(self, environ: Mapping[str, str]) -> list[str]:
        """``$CLAUDE_CONFIG_DIR/projects`` (``~/.claude/projects`` by default)."""
        return [os.path.join(home(environ, "CLAUDE_CONFIG_DIR", ".claude"), "projects")]

    def is_session_file(self, path: str) -> bool:
        """Every ``*.jsonl`` but subagent transcripts (``agent-*``) and ``history.jsonl``."""
        name = os.path.basename(path)
        return name.endswith(".jsonl") and not name.startswith("agent-") and name != "history.jsonl"

    def skip_folder(self, name: str) -> bool:
        """``subagents`` folders: each subagent's own conversation."""
        return name == "subagents"

    def new_parser(self, path: str) -> SessionParser:
        """A ``ClaudeCodeSession`` whose thread defaults to the file name."""
        return ClaudeCodeSession(self.default_thread(path))


class CodexHost(HostAdapter):
    """Codex CLI's ``~/.codex/sessions/**/rollout-*.jsonl`` rollouts."""

    name = "codex"
    summary = "Codex CLI rollouts (~/.codex/sessions)"
    hook_event = "Stop"

    def default_roots(self, environ: Mapping[str, str]) -> list[str]:
        """``$CODEX_HOME/sessions`` (``~/.codex``), and ``archived_sessions`` when it exists."""
        codex_home = home(environ, "CODEX_HOME", ".codex")
        roots = [os.path.join(codex_home, "sessions")]
        archived = os.path.join(codex_home, "archived_sessions")
        if os.path.isdir(archived):
            roots.append(archived)
        return roots

    def is_session_file(self, path: str) -> bool:
        """``rollout-*.jsonl``."""
        name = os.path.basename(path)
        return name.startswith("rollout-") and name.endswith(".jsonl")

    def default_thread(self, path: str) -> str:
        """The UUID that ends a rollout's name (else the name)."""
        stem = super().default_thread(path)
        m = _UUID_TAIL.search(stem)
        return m.group(1) if m else stem

    def new_parser(self, path: str) -> SessionParser:
        """A ``CodexSession`` whose thread defaults to the rollout's UUID."""
        return CodexSession(self.default_thread(path))
