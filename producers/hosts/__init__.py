"""Agent hosts' own transcripts as completed turns: pure, deterministic parsers (no Kafka, no I/O).

Each host is an adapter (``adapter.HostAdapter``) found by its format name in the ``throughline.hosts``
entry point group. docs/hosts.md gives the mapping and the sources it was read from.

Its modules, one concern each:

- ``adapter``: ``HostAdapter``, everything throughline needs to know about one host;
- ``registry``: the adapters this installation knows (the entry point group);
- ``builtin``: the adapters of the first two hosts, Claude Code and Codex CLI;
- ``claude_code``: Claude Code's ``~/.claude/projects/**/<session>.jsonl``;
- ``codex``: Codex CLI's ``~/.codex/sessions/**/rollout-*.jsonl``;
- ``gemini_cli``: Gemini CLI's chat recordings; ``qwen_code``: Qwen Code's sessions;
- ``copilot_cli``: GitHub Copilot CLI's session event logs;
- ``opencode``: OpenCode's sessions (parser and adapter); ``opencode_db``: its SQLite store as a line source;
  ``opencode_tree``: its older JSON tree (``storage/``) as the same records;
- ``lines``: what every transcript parser shares (the ``SessionParser`` port, one JSON object a line);
- ``turns``: what the parsers of hosts that write a flat list of messages share;
- ``records``: sessions that are not JSON Lines files, read as line sources;
- ``sources``: the line source of one host format (what ``ingest --format NAME`` reads);
- ``files``: where each host keeps its session files, and which files under a folder are sessions;
- ``render``: the one deterministic rendering of a turn's body, for every host.
"""

from __future__ import annotations

from throughline.producers.hosts.claude_code import ClaudeCodeSession
from throughline.producers.hosts.codex import CodexSession
from throughline.producers.hosts.files import default_roots, new_parser, session_files
from throughline.producers.hosts.render import HostTurn, render_body


def __getattr__(name: str) -> tuple[str, ...]:
    # the installed hosts' names, found when first asked for (see ``files``)
    if name == "FORMATS":
        from throughline.producers.hosts.registry import names

        return names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FORMATS",
    "ClaudeCodeSession",
    "CodexSession",
    "HostTurn",
    "default_roots",
    "new_parser",
    "render_body",
    "session_files",
]
