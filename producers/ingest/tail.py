"""Reading complete lines from a file, optionally following it like ``tail -F``, or from stdin.

Following survives truncation (the file shrinks below our read position: read again from 0) and
rotation (the path names another inode: the rest of the old file is read first, then the new file from
0). A line is only complete once its newline was written; without ``--follow`` a last line without a
newline is taken as is.
"""

from __future__ import annotations

import errno
import hashlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO

from throughline.producers.exceptions import InputFileMissingError, InputFileUnreadableError
from throughline.producers.ingest.jsonl import MAX_LINE_BYTES
from throughline.producers.ingest.state import FileId, IngestState

POLL_INTERVAL = 0.2
_READ_BYTES = 64 * 1024


def _holds_line(fh: IO[bytes], state: IngestState) -> bool:
    """Whether the file still holds, at the saved range, the line whose digest the state recorded."""
    if state.line_start is None or state.line_sha256 is None:
        return True  # nothing to check (an over-long line, or a state written without the check)
    fh.seek(state.line_start)
    data = fh.read(max(0, state.offset - state.line_start))
    line = data[:-1] if data.endswith(b"\n") else data
    return hashlib.sha256(line).digest() == state.line_sha256


def state_problem(fh: IO[bytes], st: os.stat_result, state: IngestState) -> str | None:
    """Why a saved state does not fit the open file ``fh`` (``None`` when reading may resume there).

    Moves the file position.
    """
    if state.file != FileId.of(st):
        return "the state names another file (rotated?)"
    if st.st_size < state.offset:
        return "shorter than the saved position (truncated?)"
    if not _holds_line(fh, state):
        return "no longer holds the saved line (rewritten?)"
    return None


@dataclass(frozen=True, slots=True)
class Line:
    """One complete line of input: its number, bytes (without the newline) and where it ends."""

    number: int
    data: bytes
    end: int  # byte offset just after the line (and its newline)
    file: FileId | None  # None for stdin
    too_long: int = 0  # when > 0 the line was longer than MAX_LINE_BYTES (its bytes were dropped)
    start: int = 0  # byte offset of the line's first byte
    path: str = ""  # the file it was read from ("-" for stdin)
    generation: int = 0  # how many times the reader started the path over (truncated, replaced)
    #: Not a line of the file: "the file is final after line ``number``" (``SessionFiles`` with a settle
    #: time); its turns are what the parser's ``settle`` returns, sent after that line's.
    settle: bool = False


class Stopped(Exception):
    """Raised from the signal handler to break out of a blocking read of stdin."""


class LineReader:
    """Reads complete lines from a file (optionally following it like ``tail -F``) or from stdin.

    Every wait is bounded: ``poll`` sleeps at most ``poll_interval`` and returns, so the caller can
    collect acknowledgements, save state and notice a stop request in between.
    """

    def __init__(
        self,
        path: str,
        *,
        follow: bool = False,
        start: IngestState | None = None,
        poll_interval: float = POLL_INTERVAL,
        notice: Callable[[str], None] = lambda message: None,
        max_line_bytes: int = MAX_LINE_BYTES,
        partial_last_line: bool = True,
    ) -> None:
        """``partial_last_line=False``: at the end of a file that is not followed, a last line without
        its newline is not a line (a host may still be writing it); it is said in a notice."""
        self.path = path
        self.max_line_bytes = max_line_bytes
        self.partial_last_line = partial_last_line
        self.generation = 0
        self._suspended = False
        self.follow = follow
        self.poll_interval = poll_interval
        self._notice = notice
        self._stdin = path == "-"
        self._fh: IO[bytes] | None = None
        self.file: FileId | None = None
        self._pos = 0  # byte offset of the start of the bytes in _partial
        self._partial = bytearray()
        self._too_long = 0  # bytes dropped from the current (over-long) line
        self._line = 0
        self.eof = False  # a non-following reader reached the end
        self.blocking = False
        self._start = start
        if self._stdin:
            self._fh = sys.stdin.buffer
            return
        if not self._open(start):
            self._notice(f"{self.path}: does not exist yet; waiting for it")

    # -- opening

    def _open(self, start: IngestState | None) -> bool:
        try:
            fh = open(self.path, "rb")  # kept open across polls while following
        except FileNotFoundError:
            if not self.follow:
                raise InputFileMissingError(f"{self.path}: no such file") from None
            return False
        except OSError as exc:
            raise InputFileUnreadableError(f"{self.path}: {exc.strerror}") from None
        st = os.fstat(fh.fileno())
        self._fh, self.file = fh, FileId.of(st)
        self._pos, self._line = 0, 0
        self._partial.clear()
        self._too_long = 0
        if start is not None:
            problem = state_problem(fh, st, start)
            if problem is not None:
                self._notice(f"{self.path}: {problem}; starting at line 1")
                fh.seek(0)
            else:
                fh.seek(start.offset)
                self._pos, self._line = start.offset, start.line
        return True

    def close(self) -> None:
        """Close the file (never stdin)."""
        if self._fh is not None and not self._stdin:
            self._fh.close()
        self._fh = None
        self._suspended = False

    def size(self) -> int | None:
        """The size of the open file now (``None`` when none is open)."""
        if self._fh is None or self._stdin:
            return None
        return os.fstat(self._fh.fileno()).st_size

    def fits(self, state: IngestState) -> str | None:
        """Why ``state`` does not fit the open file (``None`` when it does); the read position stays."""
        if self._fh is None or self._stdin:
            return "no file is open"
        where = self._fh.tell()
        try:
            return state_problem(self._fh, os.fstat(self._fh.fileno()), state)
        finally:
            self._fh.seek(where)

    def suspend(self) -> None:
        """Close the file until the next read, keeping the position (a follower of thousands of files
        keeps none of them open between polls). Reading again reopens the path: the same file resumes
        where it stopped; another file (replaced: a new inode) or a shorter one starts over at 0."""
        if self._stdin or self._fh is None:
            return
        self._fh.close()
        self._fh = None
        self._suspended = True

    def _resume(self) -> bool:
        try:
            fh = open(self.path, "rb")
        except OSError:
            return False  # deleted or unreadable meanwhile: nothing to read now
        st = os.fstat(fh.fileno())
        read_to = self._pos + len(self._partial) + self._too_long
        self._suspended = False
        self._fh = fh
        if FileId.of(st) != self.file or st.st_size < read_to:
            what = "replaced" if FileId.of(st) != self.file else "truncated"
            self._notice(f"{self.path}: {what}; reading it again from its start")
            self.file = FileId.of(st)
            self._restart()
        else:
            fh.seek(read_to)
        return True

    def _restart(self) -> None:
        assert self._fh is not None
        self._fh.seek(0)
        self._pos, self._line = 0, 0
        self._partial.clear()
        self._too_long = 0
        self.generation += 1

    # -- reading

    def _take(self, chunk: bytes) -> Line | None:
        """Add bytes read; return a complete line when ``chunk`` ended one."""
        complete = chunk.endswith(b"\n")
        body = chunk[:-1] if complete else chunk
        if self._too_long or len(self._partial) + len(body) > self.max_line_bytes:
            self._too_long += len(self._partial) + len(body)
            self._partial.clear()
        else:
            self._partial += body
        if not complete:
            return None
        return self._emit(newline=True)

    def _emit(self, *, newline: bool) -> Line:
        self._line += 1
        end = self._pos + len(self._partial) + self._too_long + (1 if newline else 0)
        if self._too_long:
            # _pos tracked the line start; the dropped bytes are accounted for in ``end``.
            line = Line(self._line, b"", end, self.file, self._too_long, self._pos, self.path, self.generation)
        else:
            line = Line(self._line, bytes(self._partial), end, self.file, 0, self._pos, self.path, self.generation)
        self._pos = end
        self._partial.clear()
        self._too_long = 0
        return line

    def _read_chunk(self) -> bytes:
        assert self._fh is not None
        # Small reads: BufferedReader.readline(limit) allocates ``limit`` bytes up front on every call.
        limit = min(_READ_BYTES, self.max_line_bytes + 1 - len(self._partial)) if not self._too_long else _READ_BYTES
        self.blocking = self._stdin
        try:
            return self._fh.readline(max(1, limit))
        finally:
            self.blocking = False

    def lines(self) -> Iterator[Line]:
        """Complete lines available now; in follow mode stops at the current end (call again later)."""
        if self._fh is None and self._suspended and not self._resume():
            return
        if self._fh is None:
            return
        yield from self._complete_lines()
        if not self.follow or self._stdin:
            # the end of input: a last line without a newline is still a line (unless told otherwise)
            if self._partial or self._too_long:
                if self.partial_last_line or self._stdin:
                    yield self._emit(newline=False)
                else:
                    self._notice(f"{self.path}: the last line has no newline yet (still being written?); not read")
            self.eof = True

    def check_file(self) -> Iterator[Line]:
        """Following: notice a truncation or rotation of the path (yields the old file's last lines)."""
        if self._stdin or not self.follow:
            return
        if self._fh is None:
            if self._open(self._start):
                self._notice(f"{self.path}: appeared; following it")
            return
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return  # rotated away and not yet replaced: keep reading the old file
        except OSError as exc:
            if exc.errno == errno.EACCES:
                return
            raise
        if FileId.of(st) != self.file:
            # Rotation: finish the old file (the writer may have appended before switching), then switch.
            yield from self._drain_old()
            self.close()
            self._notice(f"{self.path}: rotated; following the new file from its start")
            self._open(None)
            self.generation += 1
            return
        read_to = self._pos + len(self._partial) + self._too_long
        if st.st_size < read_to:
            self._notice(f"{self.path}: truncated; reading it again from its start")
            self._restart()

    def _complete_lines(self) -> Iterator[Line]:
        """The complete lines readable now; the bytes of an unfinished line stay in ``_partial`` (``_pos``
        is their start)."""
        while True:
            chunk = self._read_chunk()
            if not chunk:
                break
            line = self._take(chunk)
            if line is not None:
                yield line

    def _drain_old(self) -> Iterator[Line]:
        yield from self._complete_lines()
        if self._partial or self._too_long:
            yield self._emit(newline=False)
