"""Sessions that are not JSON Lines files, read as line sources: the base the row and document sources share.

The ingest loop reads ``Line``s: a ``RecordSource`` presents each session as a list of immutable records
(record N is line N, its JSON the line's bytes), so the parsers, the resume state and the loop are the
ones of line files. Two kinds: ``opencode_db.OpenCodeSource`` (rows of a database) and ``DocumentSource``
(session files a host rewrites whole as one JSON document, ``HostAdapter.is_document``).
``CombinedSource`` reads several sources as one (a host with both line files and documents).

Resuming: the state records per session how many records the broker acknowledged (``IngestState.offset``
and ``line``) and the SHA-256 of the last; a session is skipped up to there only when its record there
still has that digest, else all its turns are sent again (the projector applies a duplicate once).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from throughline.producers.exceptions import InputFileMissingError
from throughline.producers.hosts.adapter import HostAdapter
from throughline.producers.hosts.lines import SessionParser
from throughline.producers.ingest.state import FileId, IngestState
from throughline.producers.ingest.tail import Line

if TYPE_CHECKING:
    from throughline.producers.ingest.run import LineMark

__all__ = ["CombinedSource", "DocumentSource", "RecordSource", "Tracked", "encode_record"]

#: The largest whole-document session file read (a bigger one is skipped and said).
MAX_DOCUMENT_BYTES = 256 * 1024 * 1024


def encode_record(record: Mapping[str, Any]) -> bytes:
    """A record's bytes: compact, key-sorted JSON (so the same record always has the same digest)."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(slots=True)
class Tracked:
    """One session of a record source: its parser and how many of its records were presented."""

    path: str
    parser: SessionParser
    saved: IngestState | None
    skip_to: int = 0  # turns completed by records up to this number are not sent again
    count: int = 0
    generation: int = 0

    def settled(self, mark: LineMark) -> IngestState | None:
        """The state covering ``mark`` (a record source presents a turn only once it ended: it never settles)."""
        return mark.state()


class RecordSource:
    """The shape of ``SessionFiles`` (what ``Ingest``, ``SessionDecoder`` and ``SessionsState`` use) over
    sessions of records. Subclasses implement ``lines``; one thread uses a source."""

    blocking = False

    def __init__(
        self,
        adapter: HostAdapter,
        roots: list[str],
        *,
        follow: bool = False,
        states: Mapping[str, IngestState] | None = None,
        poll_interval: float = 0.5,
        notice: Callable[[str], None] = lambda message: None,
        settle: float | None = None,
        final: bool = False,
    ) -> None:
        """``settle`` and ``final`` are ``SessionFiles``'s; a record source presents a turn only once its
        records say it ended, so it has nothing to settle and takes them for the common signature."""
        self.adapter = adapter
        self.format = adapter.name
        self.roots = [os.path.abspath(r) for r in roots]
        self.path = ", ".join(roots)
        self.follow = follow
        self.eof = False
        self.poll_interval = poll_interval
        self.tracked: dict[str, Tracked] = {}
        self.settle, self.final = settle, final
        #: the last acknowledged record of a session (set by the runner)
        self.covered: Callable[[str], LineMark | None] = lambda path: None
        self._states = dict(states or {})
        self._notice = notice
        for root in self.roots:
            if not os.path.exists(root):
                if not follow:
                    raise InputFileMissingError(f"{root}: no such file or directory")
                notice(f"{root}: does not exist yet; waiting for it")

    def _tracked(self, path: str) -> Tracked:
        t = self.tracked.get(path)
        if t is None:
            t = self.tracked[path] = Tracked(path, self.adapter.new_parser(path), self._states.get(path))
        return t

    def _present(self, t: Tracked, file: FileId, encoded: list[bytes]) -> Iterator[Line]:
        """Lines for ``encoded``, the session's records after those presented (its first read checks the
        saved state against them)."""
        if t.count == 0 and t.saved is not None:
            n = t.saved.offset
            fits = t.saved.file == file and n <= len(encoded)
            fits = fits and (n == 0 or t.saved.line_sha256 in (None, hashlib.sha256(encoded[n - 1]).digest()))
            if fits:
                t.skip_to = n
            else:
                self._notice(f"{t.path}: the saved record is no longer there; sending its turns again")
            t.saved = None
        for data in encoded:
            t.count += 1
            yield Line(t.count, data, t.count, file, start=t.count - 1, path=t.path, generation=t.generation)

    def _restart(self, t: Tracked) -> None:
        """Present the session again from its first record, to a fresh parser (its records changed)."""
        t.parser = self.adapter.new_parser(t.path)
        t.count, t.skip_to = 0, 0
        t.generation += 1

    def lines(self) -> Iterator[Line]:
        """The records presented now, session by session."""
        raise NotImplementedError

    def check_file(self) -> Iterator[Line]:
        """Nothing to do between polls (new sessions are found in ``lines``)."""
        return iter(())

    def parser_of(self, line: Line) -> tuple[Tracked, SessionParser] | None:
        """The session a record belongs to and its parser."""
        t = self.tracked.get(line.path)
        return (t, t.parser) if t is not None and line.generation == t.generation else None

    def close(self) -> None:
        """Release what the source holds."""


class DocumentSource(RecordSource):
    """Session files the host rewrites whole, one JSON document each (``HostAdapter.is_document``).

    A document is read again whenever its size or modification time changes; its records
    (``HostAdapter.document_records``) after those presented are presented. When an earlier record
    changed (the host rewrote history), the session is presented again from its first record.
    """

    def __init__(self, adapter: HostAdapter, roots: list[str], **options: Any) -> None:
        super().__init__(adapter, roots, **options)
        self._seen: dict[str, tuple[int, int, int]] = {}  # path -> (inode, size, mtime_ns) at the last read
        self._digests: dict[str, list[bytes]] = {}  # path -> the digests of the records presented

    def _documents(self) -> list[str]:
        return sorted(
            {p for root in self.roots for p in self.adapter.session_files(root) if self.adapter.is_document(p)}
        )

    def _read(self, path: str) -> list[bytes] | None:
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_DOCUMENT_BYTES + 1)
        except OSError as exc:
            self._notice(f"{path}: {exc.strerror or exc}; skipped")
            return None
        if len(data) > MAX_DOCUMENT_BYTES:
            self._notice(f"{path}: over {MAX_DOCUMENT_BYTES} bytes; skipped")
            return None
        try:
            document = json.loads(data.decode("utf-8", "replace"))
        except ValueError:
            return None  # being rewritten, or damaged: read again when it changes
        return [encode_record(r) for r in self.adapter.document_records(document)]

    def lines(self) -> Iterator[Line]:
        """New records of every document that changed since it was last read."""
        for path in self._documents():
            try:
                st = os.stat(path)
            except OSError:
                continue
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            if self._seen.get(path) == stamp:
                continue
            encoded = self._read(path)
            if encoded is None:
                continue
            self._seen[path] = stamp
            t = self._tracked(path)
            digests = [hashlib.sha256(e).digest() for e in encoded]
            presented = self._digests.get(path, [])
            if digests[: len(presented)] != presented:
                self._restart(t)
                presented = []
            self._digests[path] = digests
            yield from self._present(t, FileId.of(st), encoded[len(presented) :])
        if not self.follow:
            self.eof = True


class CombinedSource:
    """Several line sources read as one (a host with JSON Lines files and whole documents)."""

    blocking = False

    def __init__(self, sources: list[Any]) -> None:
        self.sources = sources
        first = sources[0]
        self.format, self.path, self.follow = first.format, first.path, first.follow
        self.poll_interval = min(s.poll_interval for s in sources)
        self.eof = False

    @property
    def tracked(self) -> dict[str, Any]:
        """Every source's sessions."""
        return {path: t for s in self.sources for path, t in s.tracked.items()}

    @property
    def covered(self) -> Callable[[str], LineMark | None]:
        """The runner's last acknowledged line of a file (handed to every source)."""
        return self.sources[0].covered

    @covered.setter
    def covered(self, value: Callable[[str], LineMark | None]) -> None:
        for s in self.sources:
            s.covered = value

    @property
    def final(self) -> bool:
        """Whether a settle is the host's own word that its turn is over (as ``SessionFiles.final``)."""
        return bool(self.sources[0].final)

    def lines(self) -> Iterator[Line]:
        """Each source's lines in turn."""
        for s in self.sources:
            yield from s.lines()
        self.eof = all(s.eof for s in self.sources)

    def check_file(self) -> Iterator[Line]:
        """Each source's between-poll work."""
        for s in self.sources:
            yield from s.check_file()

    def parser_of(self, line: Line) -> Any:
        """The parser of the source the line came from."""
        for s in self.sources:
            if line.path in s.tracked:
                return s.parser_of(line)
        return None

    def close(self) -> None:
        """Close every source."""
        for s in self.sources:
            s.close()
