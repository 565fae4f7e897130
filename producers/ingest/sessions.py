"""Ingesting hosts' session files (``ingest --format claude-code|codex``): many files, one loop.

``SessionFiles`` is the line source: it finds the session files under each PATH, reads each with a
``LineReader`` (the same tail machinery as JSON Lines: complete lines only, truncation and replacement
noticed) and, following, polls them all from one thread: a file is opened only when ``stat`` shows it
changed and is closed again after the read (``LineReader.suspend``), new files are found by a rescan
every ``RESCAN_INTERVAL`` seconds, a deleted file is forgotten, and the parser of a file idle for
``EVICT_AFTER`` seconds is dropped (it is rebuilt from the file if the file grows again). Thousands of
files cost a ``stat`` each per poll, no thread and no descriptor each.

``SessionDecoder`` feeds each line to its file's parser (``throughline.producers.hosts``) and builds
the completed turns. Resuming: the state (``throughline.ingest_sessions_state.v1``) records, per file,
the last line whose turns the broker acknowledged. A file with new bytes is parsed again from its start
(a parser's state is the whole file before it) and the turns completed by lines up to the saved one are
not sent again; a file that did not change since is not read at all. A file that no longer holds the
saved line (rewritten, replaced) is read from its start and its turns are all sent (the projector
applies a repeated turn once). So is a file whose state was saved by another version of its parser
(``SessionParser.version``, recorded per file as ``parserVersion``; absent: the parsers before
versions): the newer parser may number or render the turns before the saved line otherwise, and
sending only those after it would leave the thread a gap; sent whole, the projector's fold turns what
differs into a rewind of the thread (docs/design.md, "Re-ingesting with a newer parser").

Settling (``settle``, seconds): a file that has not grown for that long is final for now, and its
parser's ``settle()`` is called after its last line: the turns it returns (an open turn that has its
reply) are sent like the turns of a line, after that line's (``Line.settle``). A turn the host has
marked ended (``SessionParser.turn_ended``: an ``end_turn`` message whose later lines may still come)
is settled after ``ENDED_TURN_QUIET`` seconds instead. A one-shot run settles
a file whose modification time is that old when it is read (``0``: every file); a follower settles a
file once it has been idle that long, and reads on with the same parser when it grows again. The
state records the lines after which a settle's turns were acknowledged (``settled``) and whether the
last line was settled (``settledEnd``): a file parsed again from line 1 is settled again at those
lines (the turns are not sent again, and the parser reads on exactly as the run that sent them did,
so a later line never completes a settled turn a second time); a file unchanged since a state that
did not settle its end is read again to settle it, and one whose end was settled is not read at all.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from throughline.core.turn import TurnRecord, build_turn
from throughline.errors import InputError
from throughline.producers.exceptions import (
    InputFileMissingError,
    LineTooLongError,
    TranscriptLineError,
    TurnLeftOutError,
)
from throughline.producers.hosts.files import SessionParser, new_parser, session_files
from throughline.producers.hosts.render import HostTurn
from throughline.producers.ingest.run import LineMark
from throughline.producers.ingest.state import FileId, IngestState, save_session_states
from throughline.producers.ingest.tail import Line, LineReader

#: A transcript line holds whole tool outputs and pasted images; lines longer than this are skipped.
MAX_TRANSCRIPT_LINE_BYTES = 64 * 1024 * 1024
SESSION_POLL_INTERVAL = 0.5
RESCAN_INTERVAL = 2.0
EVICT_AFTER = 300.0
#: Seconds of quiet after which a turn whose last message carried the host's end mark (``end_turn``) is
#: settled: the message's block lines are written together, so only a crash mid-message waits longer.
ENDED_TURN_QUIET = 2.0


@dataclass(slots=True)
class _Tracked:
    path: str
    saved: IngestState | None  # the saved state at start (None: never ingested)
    reader: LineReader | None = None
    parser: SessionParser | None = None
    generation: int = 0
    skip_to: int = 0  # turns completed by lines ending at or before this offset are not sent again
    seen: tuple[FileId, int] | None = None  # (file, size) at the last read
    active_at: float = field(default_factory=time.monotonic)
    mtime: float = 0.0  # st_mtime at the last stat
    last: Line | None = None  # the last line read of this parse
    replay: frozenset[int] = frozenset()  # settle again after these lines (acknowledged by an earlier run)
    points: list[int] = field(default_factory=list)  # lines after which this parse settled with turns
    settled_at: int = 0  # the line after which the parser was last settled (0: never)
    version: int | None = None  # the version of the parser this parse reads with (set when it starts)

    def restart(self, replay: frozenset[int] = frozenset()) -> None:
        """A parse from line 1 begins (the settles of the one before do not hold; those of ``replay``, an
        earlier run's acknowledged ones, do)."""
        self.last, self.replay, self.points, self.settled_at = None, replay, sorted(replay), 0

    def settle_line(self) -> Line | None:
        """The settle after the last line read, unless the parser was settled there already."""
        last = self.last
        if last is None or self.settled_at == last.number:
            return None
        return dataclasses.replace(last, data=b"", too_long=0, settle=True)

    def settled(self, mark: LineMark) -> IngestState | None:
        """The state covering ``mark``: the settles up to it (and after it, when ``mark`` is a settle's)."""
        state = mark.state()
        if state is None:
            return None
        # A replayed settle was acknowledged by an earlier run: it holds from its line on, even before
        # this run passes it again (a state saved between the line and its settle must keep it).
        end = mark.settled or mark.number in self.replay
        points = tuple(p for p in self.points if p < mark.number or (p == mark.number and end))
        return dataclasses.replace(state, settled=points, settled_end=end, parser_version=self.version)


class SessionFiles:
    """The session files of one host format under some paths, read (and followed) as one line source."""

    blocking = False

    def __init__(
        self,
        format: str,
        roots: list[str],
        *,
        follow: bool = False,
        states: Mapping[str, IngestState] | None = None,
        poll_interval: float = SESSION_POLL_INTERVAL,
        notice: Callable[[str], None] = lambda message: None,
        rescan_interval: float = RESCAN_INTERVAL,
        evict_after: float = EVICT_AFTER,
        settle: float | None = None,
        final: bool = False,
        parsers: Callable[[str, str], SessionParser] = new_parser,
    ) -> None:
        """``settle``: seconds without growth after which a file is final for now (``None``: never);
        ``final``: a settle is the host's own word that its turn is over (a Stop hook's call);
        ``parsers(format, path)``: a fresh parser for a file."""
        self.format = format
        self.settle = settle
        self.final = final
        self._new_parser = parsers
        self.roots = [os.path.abspath(r) for r in roots]
        self.path = ", ".join(roots)
        self.follow = follow
        self.eof = False
        self.poll_interval = poll_interval
        self.rescan_interval = rescan_interval
        self.evict_after = evict_after
        self._notice = notice
        self._states = dict(states or {})
        self._version: int | None = None  # the current parser's (``parser_version``)
        self.tracked: dict[str, _Tracked] = {}
        #: the last acknowledged line (or settle) of a file (set by the runner; eviction needs it)
        self.covered: Callable[[str], LineMark | None] = lambda path: None
        self._last_scan = 0.0
        for root in self.roots:
            if not os.path.exists(root):
                if not follow:
                    raise InputFileMissingError(f"{root}: no such file or directory")
                self._notice(f"{root}: does not exist yet; waiting for it")
        self._scan()

    # ------------------------------------------------------------------------------------------ files

    def _scan(self) -> None:
        self._last_scan = time.monotonic()
        for root in self.roots:
            for path in session_files(self.format, root):
                if path not in self.tracked:
                    self.tracked[path] = _Tracked(path, self._states.get(path))

    def _activate(self, t: _Tracked) -> bool:
        """Open a file for reading from its start (its parser is built from the whole file)."""
        try:
            reader = LineReader(
                t.path,
                follow=self.follow,
                poll_interval=self.poll_interval,
                notice=self._notice,
                max_line_bytes=MAX_TRANSCRIPT_LINE_BYTES,
                partial_last_line=False,
            )
        except InputError as exc:
            self._notice(f"{t.path}: {exc.message}; skipped")
            return False
        t.skip_to = 0
        t.restart()
        parser = self._new_parser(self.format, t.path)
        t.version = parser.version
        if t.saved is not None:
            problem = reader.fits(t.saved)
            if problem is None and (t.saved.parser_version or 0) != parser.version:
                problem = (
                    f"its state was saved by parser version {t.saved.parser_version or 0}, this is version "
                    f"{parser.version}"
                )
            if problem is None:
                t.skip_to = t.saved.offset
                t.restart(frozenset(t.saved.settled))
            else:
                self._notice(f"{t.path}: {problem}; sending its turns again from line 1")
        t.reader = reader
        t.generation = reader.generation
        t.parser = parser
        return True

    def parser_version(self, path: str) -> int:
        """The version of this format's parser (of the parsers ``parsers`` builds; one per run)."""
        if self._version is None:
            self._version = self._new_parser(self.format, path).version
        return self._version

    def _settle_due(self, mtime: float, t: _Tracked | None = None) -> bool:
        if self.settle is None:
            return False
        idle = time.time() - mtime
        if t is not None and t.parser is not None and t.parser.turn_ended:
            return idle >= min(self.settle, ENDED_TURN_QUIET)
        return idle >= self.settle

    def _unchanged(self, t: _Tracked, st: os.stat_result) -> bool:
        now = (FileId.of(st), st.st_size)
        if t.reader is None and t.parser is None and t.saved is not None:
            # dormant: nothing to read while the file is still exactly what the state covers (and, when
            # it is due to settle, the state says it was settled there)
            due = self._settle_due(st.st_mtime) and not t.saved.settled_end
            # a state of another parser version: the whole file is sent again (``_activate``)
            current = (t.saved.parser_version or 0) == self.parser_version(t.path)
            return now == (t.saved.file, t.saved.offset) and not due and current
        return t.seen == now

    def _read(self, t: _Tracked) -> Iterator[Line]:
        """The file's new lines, each followed by its replayed settle (if an earlier run settled there)."""
        assert t.reader is not None
        for line in t.reader.lines():
            if t.last is not None and line.generation != t.last.generation:
                t.restart()  # read again from line 1: the parser is rebuilt (``parser_of``)
            t.last = line
            yield line
            if line.number in t.replay:
                yield dataclasses.replace(line, data=b"", too_long=0, settle=True)

    def lines(self) -> Iterator[Line]:
        """Complete lines available now, file by file."""
        for path in list(self.tracked):
            t = self.tracked.get(path)
            if t is None:
                continue
            try:
                st = os.stat(path)
            except OSError:
                if self.follow:
                    self._forget(t, "deleted")
                continue
            t.mtime = st.st_mtime
            if self._unchanged(t, st):
                if t.parser is not None and self._settle_due(t.mtime, t):
                    yield from self._settle(t)  # following: idle for the settle time since the last read
                continue
            if t.reader is None and not self._activate(t):
                continue
            assert t.reader is not None
            yield from self._read(t)
            # idle before the read and still after it (a file that grew while it was read is not)
            if self._settle_due(t.mtime, t) and self._settle_due(self._mtime(path, t.mtime), t):
                yield from self._settle(t)
            t.active_at = time.monotonic()
            size = t.reader.size()
            t.seen = (t.reader.file, size) if t.reader.file is not None and size is not None else None
            if self.follow:
                t.reader.suspend()
            else:
                t.reader.close()
        if not self.follow:
            self.eof = True

    @staticmethod
    def _mtime(path: str, otherwise: float) -> float:
        try:
            return os.stat(path).st_mtime
        except OSError:
            return otherwise

    def _settle(self, t: _Tracked) -> Iterator[Line]:
        line = t.settle_line()
        if line is not None:
            yield line

    def check_file(self) -> Iterator[Line]:
        """Following: find new session files and let idle ones go (lines are read in ``lines``)."""
        now = time.monotonic()
        if now - self._last_scan >= self.rescan_interval:
            before = len(self.tracked)
            self._scan()
            if len(self.tracked) > before:
                self._notice(f"{len(self.tracked) - before} new session file(s); following them")
        for t in self.tracked.values():
            if t.parser is None or t.reader is None or now - t.active_at < self.evict_after:
                continue
            if t.parser.open_turn:
                continue  # a turn in progress: keep its parser (rebuilding it would be just as right, but slower)
            mark = self.covered(t.path)
            if mark is None or t.seen is None or mark.end != t.seen[1] or t.settled_at > mark.number:
                continue
            if t.settled_at == mark.number and not mark.settled:
                continue  # the settle after the last line is not acknowledged yet
            saved = t.settled(mark)
            if saved is None:
                continue
            t.saved = dataclasses.replace(saved, file=t.seen[0])
            t.reader.close()
            t.reader, t.parser = None, None
        return iter(())

    def _forget(self, t: _Tracked, why: str) -> None:
        if t.reader is not None:
            t.reader.close()
        del self.tracked[t.path]
        self._notice(f"{t.path}: {why}; no longer followed")

    def parser_of(self, line: Line) -> tuple[_Tracked, SessionParser] | None:
        """The file a line was read from and its parser (built anew after a restart of the file)."""
        t = self.tracked.get(line.path)
        if t is None or t.parser is None:
            return None
        if line.generation != t.generation:
            t.generation = line.generation
            t.parser = self._new_parser(self.format, t.path)
            t.version = t.parser.version
            t.skip_to = 0
        return t, t.parser

    def close(self) -> None:
        """Close every file."""
        for t in self.tracked.values():
            if t.reader is not None:
                t.reader.close()


class SessionDecoder:
    """Lines of host session files into completed turns; unreadable lines are reported and skipped."""

    def __init__(
        self,
        files: SessionFiles,
        *,
        warn: Callable[[str], None],
        producer_name: str = "throughline-ingest",
        producer_version: str = "0",
    ) -> None:
        self.files = files
        self.warn = warn
        self.producer_name = producer_name
        self.producer_version = producer_version
        self.skipped = 0

    def label(self, line: Line | LineMark) -> str:
        """``FILE:N``."""
        return f"{line.path}:{line.number}"

    def _skip(self, line: Line, code: str, message: str) -> None:
        self.skipped += 1
        self.warn(f"{self.label(line)}: {code}: {message}")

    def turns(self, line: Line) -> list[TurnRecord]:
        """The turns a line completes and that were not acknowledged before."""
        found = self.files.parser_of(line)
        if found is None:
            return []
        tracked, parser = found
        if line.settle:
            return self._settled(line, tracked, parser)
        if line.too_long:
            self._skip(line, LineTooLongError.code, f"a line of {line.too_long} bytes; skipped")
            return []
        try:
            host_turns = parser.feed(line.number, line.data)
        except TranscriptLineError as exc:
            self._skip(line, exc.code, exc.message)
            return []
        for problem in parser.problems:
            self._skip(line, TurnLeftOutError.code, problem)
        parser.problems.clear()
        if line.end <= tracked.skip_to:
            return []  # acknowledged by an earlier run
        return self._records(line, host_turns)

    def _settled(self, line: Line, tracked: _Tracked, parser: SessionParser) -> list[TurnRecord]:
        """What settling the parser after ``line`` returns; nothing to send when an earlier run sent it."""
        host_turns = parser.settle(final=self.files.final)
        for problem in parser.problems:
            self._skip(line, TurnLeftOutError.code, problem)
        parser.problems.clear()
        tracked.settled_at = line.number
        replayed = line.number in tracked.replay
        if (host_turns or replayed) and line.number not in tracked.points:
            tracked.points.append(line.number)
        return [] if replayed else self._records(line, host_turns)

    def _records(self, line: Line, host_turns: list[HostTurn]) -> list[TurnRecord]:
        out = []
        for ht in host_turns:
            try:
                out.append(self.build(ht))
            except InputError as exc:
                self._skip(line, exc.code, f"turn {ht.turn_id}: {exc.message}")
        return out

    def build(self, ht: HostTurn) -> TurnRecord:
        """The topic record of a host turn."""
        return build_turn(
            project=ht.project,
            host=ht.host,
            thread=ht.thread,
            turn_id=ht.turn_id,
            completed_at_micros=ht.completed_at_micros,
            body=ht.body,
            seq=ht.seq,
            producer_name=self.producer_name,
            producer_version=self.producer_version,
            produced_at_micros=time.time_ns() // 1000,
            attributes=ht.attributes,
        )


class SessionsState:
    """The ingest state file of a host-format ingest: per file, the last acknowledged line."""

    def __init__(self, state_path: str, files: SessionFiles, saved: Mapping[str, IngestState]) -> None:
        self.state_path = state_path
        self.files = files
        self._base = dict(saved)

    def write(self, covered: Mapping[str, LineMark]) -> None:
        """Save every followed file's covered line (files not read this run keep their saved state)."""
        states: dict[str, IngestState] = {}
        for path, tracked in self.files.tracked.items():
            mark = covered.get(path)
            state = tracked.settled(mark) if mark is not None else None
            base = self._base.get(path)
            # While a file is parsed again from its start, its covered line trails the saved one, which
            # still holds while it was found valid (the turns up to it are skipped, not sent).
            resuming = base is not None and tracked.skip_to >= base.offset > (state.offset if state else -1)
            if state is None or resuming:
                state = base
            if state is not None:
                states[path] = state
        save_session_states(self.state_path, states, format=self.files.format)
