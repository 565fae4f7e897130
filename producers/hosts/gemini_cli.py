"""Gemini CLI chat recordings (``~/.gemini/tmp/<project>/chats/session-*.jsonl``) as completed turns (pure).

Read from gemini-cli's ``chatRecordingService`` and ``chatRecordingTypes`` (docs/hosts.md). The file is
append-only, one JSON object a line, of four kinds:

- the session's metadata (``sessionId``, ``projectHash``, ``startTime``, ``kind``: no ``id``);
- a message (``id``, ``timestamp``, ``type``: ``user``, ``gemini``, ``info``, ``error``, ``warning``;
  ``content``: a string or Gemini API parts; a ``gemini`` message has ``toolCalls`` with ``id``,
  ``name``, ``args``, ``status``). The host writes a message again, whole, under the same ``id`` when it
  adds tool calls or token counts: the later line replaces the earlier one;
- ``{"$set": {...}}``: a metadata update (``$set.messages`` replaces the conversation: a checkpoint);
- ``{"$rewindTo": "<id>"}``: that message and every message after it are taken back.

Mapping:

- thread = the first metadata ``sessionId`` written before any message (else the file name); project = the project folder the
  adapter found for the file (``GeminiCliHost.project_of``: gemini-cli records no working directory).
- A human prompt is a ``user`` message whose text is not one gemini-cli's own resume leaves out (empty,
  a ``/`` or ``?`` command, ``<session_context>`` or ``<hook_context>`` injected context); turnId = its
  ``id``. The reply is the text of the turn's last ``gemini`` message that has text (``thought`` parts
  never); tool calls are its ``toolCalls`` (waiting until their ``status`` is ``success``, ``error`` or
  ``cancelled``).
- A turn ends at the next human prompt, or at ``settle()`` (the ``AfterAgent`` hook, or a file that
  stopped growing) once the model answered with no tool call waiting. Outcome: ``answered``; else
  ``aborted`` when an ``error`` message is the turn's last record, else ``interrupted``. completedAt =
  the timestamp of the turn's last ``gemini`` message (a rewrite keeps it), whatever ends the turn.
- ``$rewindTo`` a turn's prompt takes that turn and the later ones off the chain (the next prompt's seq
  rewinds); to another message of the open turn, cuts the open turn back; to an id the file does not
  hold, clears the conversation (as gemini-cli's reader does). A ``$set.messages`` checkpoint is the
  model-facing history after a compression or a masking (``updateMessagesFromHistory``): no rewind, the
  chain keeps every turn; a later ``$rewindTo`` one of its own messages (a summary) takes back the turns
  recorded after it.
- A ``kind: "subagent"`` file is a subagent's own conversation: no turns.
- Earlier versions wrote ``session-*.json``: the whole ``ConversationRecord`` (metadata and ``messages``),
  rewritten at every message. The adapter presents it as its metadata then its messages
  (``GeminiCliHost.document_records``), so the same parser reads it; a ``.json`` with a ``.jsonl``
  beside it (converted when resumed) is left out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from throughline.producers.hosts.adapter import HostAdapter
from throughline.producers.hosts.lines import SessionParser, nonempty_str, timestamp_micros
from throughline.producers.hosts.render import HostTurn, tool_line
from throughline.producers.hosts.turns import Chain, OpenTurn, OpenTurnSession, host_turn

__all__ = ["HOST", "GeminiCliHost", "GeminiCliSession", "message_text"]

HOST = "gemini-cli"
#: How a user message that is no prompt begins (gemini-cli ``isIgnoredUserContent``).
IGNORED_PREFIXES = ("/", "?", "<session_context>", "<hook_context>")
_DONE = ("success", "error", "cancelled", "canceled")


def message_text(content: Any) -> str:
    """The text of a message's ``content``: a string, a part, or a list of parts (``thought`` parts left out)."""
    if isinstance(content, str):
        return content
    if isinstance(content, Mapping):
        content = [content]
    if not isinstance(content, list):
        return ""
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping) and not part.get("thought"):
            if isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part.get("inlineData"), Mapping):
                texts.append("[image]")
    return "".join(texts)


class GeminiCliSession(OpenTurnSession):
    """The turns of one Gemini CLI chat recording, fed line by line in file order (prefix-stable)."""

    host = HOST

    def __init__(self, default_thread: str, project: str | None) -> None:
        self.default_thread = default_thread
        self.project = project
        self.thread: str | None = None
        self.subagent = False
        self.chain = Chain()
        self._open: OpenTurn | None = None
        self._open_ids: list[str] = []  # the open turn's message ids, prompt first
        self._turn_of: dict[str, str] = {}  # message id -> the turn (prompt id) it belongs to
        self._synthetic: dict[str, int] = {}  # a checkpoint's own message id -> the chain's length then
        self._last_number = 0
        self.problems: list[str] = []

    def take(self, number: int, entry: dict[str, Any]) -> list[HostTurn]:
        """The turns one parsed line completes."""
        self._last_number = number
        if isinstance(entry.get("$rewindTo"), str):
            self._rewind(entry["$rewindTo"])
            return []
        if isinstance(entry.get("$set"), Mapping):
            messages = entry["$set"].get("messages")
            if isinstance(messages, list):
                self._checkpoint(messages)
            return []
        message_id = nonempty_str(entry.get("id"))
        if message_id is None:
            if self.thread is None and nonempty_str(entry.get("sessionId")):
                self.thread = entry["sessionId"]
                self.subagent = entry.get("kind") == "subagent"
            return []
        if self.subagent:
            return []
        if self.thread is None:
            # a session's first message names its thread for good: metadata written after it (a
            # resumed or rewritten file) must not move the turns already sent to another thread
            self.thread = self.default_thread
        return self._message(number, message_id, entry)

    def _message(self, number: int, message_id: str, entry: dict[str, Any]) -> list[HostTurn]:
        kind = entry.get("type")
        micros = timestamp_micros(entry.get("timestamp"))
        open_ = self._open
        owner = self._turn_of.get(message_id)
        if owner is not None and (open_ is None or owner != open_.turn_id):
            return []  # a message of a finished turn written again: that turn was sent as it was
        if kind == "user" and open_ is not None and message_id == open_.turn_id:
            text = message_text(entry.get("content"))
            open_.prompt = text if text.strip() else open_.prompt  # the prompt written again
            return []
        if kind == "user":
            text = message_text(entry.get("content"))
            if text.strip() and not text.strip().startswith(IGNORED_PREFIXES):
                out = self._close(number) if open_ is not None else []
                self._open = OpenTurn(message_id, text, self.project, self.chain.next_seq(), micros)
                self._open_ids = [message_id]
                self._turn_of[message_id] = message_id
                return out
            return []
        if open_ is None:
            return []
        if message_id not in self._open_ids:
            self._open_ids.append(message_id)
            self._turn_of[message_id] = open_.turn_id
        if kind == "gemini":
            calls = [c for c in entry.get("toolCalls") or [] if isinstance(c, Mapping)]
            for call in calls:
                line = tool_line(call.get("name"), call.get("args"))
                open_.call(nonempty_str(call.get("id")), line, done=call.get("status") in _DONE)
            text = message_text(entry.get("content"))
            if text.strip():
                open_.said(text, None)
            if micros is not None:  # a rewritten message keeps its timestamp: the latest message's wins
                open_.last_micros = max(open_.last_micros or micros, micros)
            if calls:
                open_.answered_last = False  # the model speaks again once its tool calls have their results
        elif kind == "error":
            open_.failed = True
            open_.answered_last = False
        return []

    def _close(self, number: int, outcome: str | None = None) -> list[HostTurn]:
        open_ = self._open
        self._open, self._open_ids = None, []
        if open_ is None:
            return []
        completed = open_.last_micros if open_.last_micros is not None else open_.prompt_micros
        if open_.project is None or completed is None:
            self.problems.append(
                f"turn {open_.turn_id} has no {'project' if open_.project is None else 'timestamp'}; left out"
            )
            return []
        outcome = outcome or open_.outcome()
        self.chain.add(open_.seq, open_.turn_id)
        return [host_turn(HOST, self.thread or self.default_thread, open_, open_.project, completed, number, outcome)]

    def _rewind(self, message_id: str) -> None:
        owner = self._turn_of.get(message_id)
        open_ = self._open
        if open_ is not None and owner == open_.turn_id and message_id != open_.turn_id:
            # the model's messages from there on are taken back; the prompt stays open
            self._open = OpenTurn(open_.turn_id, open_.prompt, open_.project, open_.seq, open_.prompt_micros)
            cut = self._open_ids.index(message_id)
            for taken in self._open_ids[cut:]:
                del self._turn_of[taken]
            self._open_ids = self._open_ids[:cut]
            return
        self._open, self._open_ids = None, []  # every later message is taken back, the open turn with them
        if owner is None and message_id in self._synthetic:
            del self.chain.turn_ids[self._synthetic[message_id] :]  # back to a checkpoint's summary
        elif owner is None:
            self.chain.clear()  # an id the file does not hold: gemini-cli clears the conversation
        elif owner == message_id:
            self.chain.rewind_to(owner)  # the prompt itself: that turn and every later one
        elif owner in self.chain.turn_ids:
            del self.chain.turn_ids[self.chain.turn_ids.index(owner) + 1 :]

    def _checkpoint(self, messages: list[Any]) -> None:
        """``$set.messages``: the model-facing history after a compression or a masking, no rewind.

        Its messages that the file does not hold otherwise (a compression's summary) are points a later
        ``$rewindTo`` may name: rewinding there takes back the turns recorded after the checkpoint.
        """
        point = self._open.seq if self._open is not None else self.chain.next_seq() - 1
        for m in messages:
            message_id = nonempty_str(m.get("id")) if isinstance(m, Mapping) else None
            if message_id is not None and message_id not in self._turn_of:
                self._synthetic[message_id] = point  # the turns up to the open one are before the checkpoint


class GeminiCliHost(HostAdapter):
    """Gemini CLI's ``~/.gemini/tmp/<project>/chats/session-*.jsonl`` recordings."""

    name = HOST
    summary = "Gemini CLI chat recordings (~/.gemini/tmp/*/chats)"
    hook_event = "AfterAgent"
    has_documents = True

    def default_roots(self, environ: Mapping[str, str]) -> list[str]:
        """``$GEMINI_CLI_HOME/.gemini/tmp`` (``~/.gemini/tmp`` by default)."""
        base = environ.get("GEMINI_CLI_HOME") or os.path.expanduser("~")
        return [os.path.join(base, ".gemini", "tmp")]

    def is_session_file(self, path: str) -> bool:
        """``session-*.jsonl``, and ``session-*.json`` of earlier versions (a subagent's recording is named
        after its id, in a folder of its own)."""
        name = os.path.basename(path)
        return name.startswith("session-") and name.endswith((".jsonl", ".json"))

    def is_document(self, path: str) -> bool:
        """``session-*.json``: a whole ``ConversationRecord`` the earlier versions rewrote at every message."""
        return path.endswith(".json")

    def session_files(self, root: str) -> list[str]:
        """The recordings at ``root``, without a ``.json`` whose ``.jsonl`` exists (gemini-cli converts a
        ``.json`` session to ``.jsonl`` when it is resumed, copying every message)."""
        found = super().session_files(root)
        kept = set(found)
        return [p for p in found if not (p.endswith(".json") and p + "l" in kept)]

    def document_records(self, document: Any) -> list[dict[str, Any]]:
        """A ``ConversationRecord``'s metadata, then each of its messages: the lines a ``.jsonl`` holds."""
        if not isinstance(document, Mapping):
            return []
        metadata = {k: v for k, v in document.items() if k != "messages"}
        messages = document.get("messages")
        records: list[dict[str, Any]] = [metadata]
        if isinstance(messages, list):
            records.extend(m for m in messages if isinstance(m, dict))
        return records

    def project_of(self, path: str) -> str | None:
        """The project a recording belongs to: ``.project_root`` beside ``chats``, else ``projects.json``.

        gemini-cli names a project's folder by a short id and writes the project's path in its
        ``.project_root``; ``~/.gemini/projects.json`` maps paths to those ids. Older versions named the
        folder by the SHA-256 of the path, which cannot be reversed: then the folder name is the project.
        """
        project_dir = os.path.dirname(os.path.dirname(os.path.abspath(path)))
        try:
            with open(os.path.join(project_dir, ".project_root"), encoding="utf-8") as f:
                root = f.read(64 * 1024).strip()
            if root:
                return root
        except OSError:
            pass
        short_id = os.path.basename(project_dir)
        registry = os.path.join(os.path.dirname(os.path.dirname(project_dir)), "projects.json")
        try:
            with open(registry, encoding="utf-8") as f:
                doc = json.load(f)
            projects = doc.get("projects") if isinstance(doc, dict) else None
            if isinstance(projects, dict):
                for root, ident in sorted(projects.items()):
                    if ident == short_id:
                        return str(root)
        except (OSError, ValueError):
            pass
        return short_id or None

    def new_parser(self, path: str) -> SessionParser:
        """A ``GeminiCliSession`` with the file's project."""
        return GeminiCliSession(self.default_thread(path), self.project_of(path))
