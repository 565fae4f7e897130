"""``HostAdapter``: everything throughline needs to know about one agent host, in one small object.

An adapter names its ``--format``, says where the host keeps its sessions, builds the parser that turns
one session's records into completed turns (the ``SessionParser`` port of ``lines``), and says which
transcript a host's hook call is about. ``throughline ingest --format NAME`` and ``throughline hook
NAME`` find adapters by name in the ``throughline.hosts`` entry point group (``registry``): the
built-in hosts are registered there by throughline's own pyproject.toml exactly as a third-party
distribution registers its own (docs/hosts.md, "Writing an adapter").

What a parser is given (``reads``):

- ``"lines"`` (the default): the host appends one JSON object a line to a file. throughline finds the
  files (``session_files``), reads complete lines only, follows growth, truncation and replacement
  (``tail -F``), keeps the resume state, and hands the parser each line in file order.
- ``"rows"``: the host keeps its sessions in a store that is not a line file (a database). The
  adapter then also provides ``open_source``: the line source that reads the store and presents each
  session as a sequence of immutable records (one JSON object each), in the same ``Line`` shape, so
  the parser, the resume state and the ingest loop are the same.

Lifecycle and threading, for every method below: an adapter is created once per process (its class
is called with no arguments) and may be used from any thread, so it keeps no mutable state. A parser
belongs to one session and is used by one thread at a time, the ingest loop's or the hook's: never
concurrently, never shared between sessions.
"""

from __future__ import annotations

import glob
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from throughline.producers.hosts.lines import SessionParser

__all__ = ["HostAdapter", "HookPayloadError", "transcript_path_of"]


class HookPayloadError(ValueError):
    """A hook payload names no transcript the adapter can find (the hook reports it and exits 1)."""


def transcript_path_of(payload: Mapping[str, Any]) -> str | None:
    """The transcript a hook payload names: ``transcript_path`` (snake case) or ``transcriptPath``."""
    for key in ("transcript_path", "transcriptPath"):
        value = payload.get(key)
        if isinstance(value, str) and value:
            return os.path.abspath(os.path.expanduser(value))
    return None


class HostAdapter(ABC):
    """One agent host: its format name, its session files, its parser and its hook.

    Subclass it, set ``name`` (and ``summary``), implement ``default_roots``, ``is_session_file`` and
    ``new_parser``, and register the class under the ``throughline.hosts`` entry point group with the
    same name. Every method is pure apart from reading the file system and ``environ``; none writes.
    """

    #: The ``--format`` and ``hook`` name: lower case, stable across releases (state files carry it).
    name: ClassVar[str]
    #: One line for ``--help`` and docs.
    summary: ClassVar[str] = ""
    #: ``"lines"``: JSON Lines files throughline reads and follows; ``"rows"``: the adapter's own source.
    reads: ClassVar[str] = "lines"
    #: The host event that runs ``throughline hook NAME`` (``None``: the host has no stop-like hook).
    hook_event: ClassVar[str | None] = None
    #: Whether some session files are whole JSON documents the host rewrites (``is_document``).
    has_documents: ClassVar[bool] = False

    @abstractmethod
    def default_roots(self, environ: Mapping[str, str]) -> list[str]:
        """The folders (or files) searched when ``ingest --format NAME`` is given no PATH.

        Called once per run, from the main thread, before any file is read; ``environ`` is the
        process environment (or a test's mapping). A root that does not exist is allowed: a one-shot
        ingest reports it, a following one waits for it.
        """

    @abstractmethod
    def is_session_file(self, path: str) -> bool:
        """Whether a file found while searching a root folder is one of the host's session files.

        Called from the ingest loop's thread, for every file under a root at every rescan (keep it
        to the path: no I/O). A path given explicitly as a file is taken whatever this says.
        """

    def skip_folder(self, name: str) -> bool:
        """Whether a folder met while searching is left out with everything under it (default: none).

        Same thread and rules as ``is_session_file``.
        """
        return False

    def default_thread(self, path: str) -> str:
        """The thread of a session whose records name none: by default the file name without its suffix.

        Called when a parser is built (ingest loop or hook thread).
        """
        stem = os.path.basename(path)
        for suffix in (".jsonl", ".json"):
            if stem.endswith(suffix):
                stem = stem[: -len(suffix)]
                break
        return stem or "session"

    @abstractmethod
    def new_parser(self, path: str) -> SessionParser:
        """A fresh parser for one session (``path`` is its file, or the source's name for the session).

        Called whenever throughline (re)reads a session from its first record: at the start, after a
        truncation or replacement, after an idle parser was dropped. The parser is then fed every
        record in order from the one thread that reads that session, and ``settle`` when the session
        is final (idle for the settle time, or the host's stop hook ran). It must be deterministic
        and prefix-stable (``SessionParser``).
        """

    def session_files(self, root: str) -> list[str]:
        """The session files at ``root`` (itself when it is a file), sorted; none when it does not exist.

        The default walks ``root`` with ``skip_folder`` and ``is_session_file``; an adapter rarely
        needs to override it. Called from the ingest loop's thread at start and at every rescan.
        """
        if os.path.isfile(root):
            return [root]
        found: list[str] = []
        for folder, subfolders, names in os.walk(root):
            subfolders[:] = sorted(d for d in subfolders if not self.skip_folder(d))
            found.extend(
                os.path.join(folder, n) for n in sorted(names) if self.is_session_file(os.path.join(folder, n))
            )
        return found

    def transcript_of(self, payload: Mapping[str, Any], environ: Mapping[str, str]) -> str:
        """The session file a hook call is about, from the JSON the host passed to the hook.

        The default takes ``transcript_path`` / ``transcriptPath``, else looks for a session file
        whose path contains the payload's session id (``session_id`` / ``sessionId``) under the
        default roots. Raises ``HookPayloadError`` when none is found. Called once per hook process,
        from its main thread, within the hook's time budget (keep any search bounded).
        """
        path = transcript_path_of(payload)
        if path is not None:
            return path
        session = payload.get("session_id") or payload.get("sessionId")
        if isinstance(session, str) and session and "/" not in session and session not in (".", ".."):
            matches: list[str] = []
            for root in self.default_roots(environ):
                pattern = os.path.join(glob.escape(root), "**", f"*{glob.escape(session)}*")
                for hit in glob.glob(pattern, recursive=True):  # a session's file, or its folder
                    matches.extend(p for p in self.session_files(hit) if self.is_session_file(p))
            if matches:
                return os.path.abspath(max(matches, key=lambda p: (os.path.getmtime(p), p)))
            raise HookPayloadError(f"no {self.name} session {session} under {', '.join(self.default_roots(environ))}")
        raise HookPayloadError("the hook payload names no transcript_path and no session id")

    def is_document(self, path: str) -> bool:
        """Whether a session file is one JSON document the host rewrites whole, not JSON Lines (default: no).

        Such a file is read whole whenever it changes and presented as the records ``document_records``
        gives (``records.DocumentSource``). Same thread and rules as ``is_session_file``; only asked when
        ``has_documents`` is set.
        """
        return False

    def document_records(self, document: Any) -> list[dict[str, Any]]:
        """The records, in order, of a whole-document session (what the parser is fed, one per line).

        Called from the ingest loop's thread each time the document changed; it must give the same
        records for the same document, and the records of an earlier version as a prefix of a later one's
        (else the session is read again from its start).
        """
        raise NotImplementedError(f"{self.name} has no whole-document sessions")

    def open_source(
        self,
        roots: list[str],
        *,
        follow: bool,
        states: Mapping[str, Any],
        poll_interval: float,
        notice: Callable[[str], None],
    ) -> Any:
        """For ``reads = "rows"``: the line source over the host's store (``SessionFiles``'s shape).

        Called once per ingest run from the main thread; the source is then used by the ingest loop's
        thread only. Line hosts never get this call.
        """
        raise NotImplementedError(f"{self.name} reads files; it has no source of its own")
