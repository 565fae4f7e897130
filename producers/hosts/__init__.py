"""Agent hosts' own transcripts as completed turns: pure, deterministic parsers (no Kafka, no I/O).

Each host is an adapter (``adapter.HostAdapter``) found by its format name in the ``throughline.hosts``
entry point group (``registry``). ``claude_code`` (Claude Code's ``~/.claude/projects/**/<session>.jsonl``), ``codex`` (Codex CLI's
``~/.codex/sessions/**/rollout-*.jsonl``), ``render`` (the one body rendering), ``files`` (where the
sessions are). docs/hosts.md gives the mapping and the sources it was read from.
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
