"""Streaming ingestion of completed turns from JSON Lines (``throughline ingest``).

Input: one turn per line, ``{"project", "host", "thread", "turnId", "completedAt", "body"}`` and an
optional ``"seq"``. Each line is parsed strictly (``TurnLine``: no extra keys, no duplicate keys, exact
JSON types, ``seq`` an integer and not ``"3"``) and built with ``build_turn``. Blank lines are skipped. A
bad line is reported on stderr as ``line N: CODE: message`` and does not stop the good lines.

Following (``--follow``) tails a growing file like ``tail -F``: it survives truncation (the file
shrinks below our read position: read again from 0) and rotation (the path names another inode: the
rest of the old file is read first, then the new file from 0). A line is only complete once its
newline was written; without ``--follow`` a last line without a newline is taken as is.

Resuming: the state file records the file identity (device, inode), the byte offset after, the number
of, and the byte range and SHA-256 of, the last line covered by the state. Every line up to that one was
either acknowledged by the broker or rejected, so a restart resumes right after it and neither skips nor
re-sends a line. A restart reads the file from 0 instead when the path now names another file, when the
file is shorter than the offset, or when the recorded line is no longer where the state says (the file
was rewritten in place while ingest was stopped, e.g. by ``logrotate copytruncate``). The state
is written (temp file, fsync, rename, fsync of the folder) only after the broker acknowledged every
turn it covers. The one remaining window: a crash after the broker acknowledged turns but before the
state recording them was written re-sends those turns on restart; the projector applies a re-sent turn
id once (same content: ``Duplicate``), so the chains do not change. Lines appended to a file after it
was rotated away while ingest was stopped are not found on restart (ingest starts the new file at 0).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from throughline.core.exceptions import InvalidTurnError
from throughline.core.turn import MAX_BODY_BYTES, TurnRecord, build_turn, parse_rfc3339
from throughline.errors import InputError, ThroughlineError
from throughline.producers.exceptions import (
    IngestStateError,
    InvalidLineError,
    ProducerError,
    SendFailedError,
)

#: A line longer than this is rejected without being held in memory. A body at the limit escaped as
#: ``\\uXXXX`` is 6x its bytes at most (control characters), so any valid turn fits.
MAX_LINE_BYTES = 6 * MAX_BODY_BYTES + 64 * 1024
POLL_INTERVAL = 0.2
STATE_SAVE_INTERVAL = 0.5
PROGRESS_INTERVAL = 2.0
#: Turns handed to the producer whose acknowledgement has not been collected yet (backpressure: when
#: either bound is reached, ingest waits for them). kafka-python 3 has no bounded send buffer of its own.
MAX_IN_FLIGHT = 10_000
MAX_IN_FLIGHT_BYTES = 64 * 1024 * 1024
STATE_SCHEMA = "throughline.ingest_state.v1"
STATE_SUFFIX = ".ingest-state"
_READ_BYTES = 64 * 1024
_BOM = b"\xef\xbb\xbf"


# ------------------------------------------------------------------------------------------------ lines


class TurnLine(BaseModel):
    """One line of an ingest file (strict: exact JSON types, no other keys)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    project: str
    host: str
    thread: str
    turn_id: str = Field(alias="turnId")
    completed_at: str = Field(alias="completedAt")
    body: str
    seq: int | None = None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise InvalidLineError(f"duplicate key {key!r}", code="invalid_json")
        out[key] = value
    return out


def _field_errors(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_input=False, include_url=False)[:4]:
        where = ".".join(str(p) for p in err["loc"]) or "line"
        parts.append(f"{where}: {err['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def parse_turn_line(
    raw: bytes | str,
    *,
    producer_name: str = "throughline-ingest",
    producer_version: str = "0",
    produced_at_micros: int = 0,
    attributes: dict[str, str] | None = None,
) -> TurnRecord | None:
    """Parse one JSON Lines line into a validated turn; ``None`` for a blank line.

    Raises ``InvalidLineError`` (``invalid_utf8``, ``invalid_json``, ``line_too_long``),
    ``InvalidTurnError`` (a field is missing, of the wrong type or invalid), ``BodyTooLargeError`` or
    ``InvalidProjectError``; every one is an ``InputError`` with a stable ``code``.
    """
    if isinstance(raw, bytes | bytearray):
        if len(raw) > MAX_LINE_BYTES:
            raise InvalidLineError(f"line is {len(raw)} bytes; the limit is {MAX_LINE_BYTES} bytes", code="line_too_long")
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidLineError(f"line is not UTF-8 (byte {exc.start})", code="invalid_utf8") from None
    else:
        text = raw
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text.strip():
        return None
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except InvalidLineError:
        raise
    except (ValueError, RecursionError) as exc:
        raise InvalidLineError(f"not JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise InvalidLineError(f"a line must be a JSON object, not {type(data).__name__}", code="invalid_json")
    try:
        line = TurnLine.model_validate(data)
    except ValidationError as exc:
        raise InvalidTurnError(_field_errors(exc)) from None
    return build_turn(
        project=line.project,
        host=line.host,
        thread=line.thread,
        turn_id=line.turn_id,
        completed_at_micros=parse_rfc3339(line.completed_at),
        body=line.body,
        seq=line.seq,
        producer_name=producer_name,
        producer_version=producer_version,
        produced_at_micros=produced_at_micros,
        attributes=attributes,
    )


# ------------------------------------------------------------------------------------------------ state


@dataclass(frozen=True, slots=True)
class FileId:
    """A file's identity on disk (what ``tail -F`` compares to notice a rotation)."""

    device: int
    inode: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileId:
        """The identity of a stat result."""
        return cls(st.st_dev, st.st_ino)


@dataclass(frozen=True, slots=True)
class IngestState:
    """Where a resumed ingest starts: right after line ``line`` ending at byte ``offset`` of file ``file``.

    ``line_start`` and ``line_sha256`` (the byte range and SHA-256 of that line's text) let a resume check
    that the file still holds that line where the state says, so a file rewritten in place while ingest
    was stopped (``logrotate copytruncate``, an editor) is read again from 0 instead of being skipped.
    """

    file: FileId
    offset: int
    line: int
    line_start: int | None = None
    line_sha256: bytes | None = None


class _StateDoc(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", strict=True, populate_by_name=True)

    schema_: str = Field(alias="schema")
    device: int = Field(ge=0)
    inode: int = Field(ge=0)
    offset: int = Field(ge=0)
    line: int = Field(ge=0)
    line_start: int | None = Field(default=None, ge=0, alias="lineStart")
    line_sha256: str | None = Field(default=None, pattern="^[0-9a-f]{64}$", alias="lineSha256")


def default_state_path(path: str) -> str:
    """The state file of a followed file when ``--state`` is not given."""
    return path + STATE_SUFFIX


def load_state(state_path: str) -> IngestState | None:
    """Read a state file; ``None`` when it does not exist. A damaged file raises ``IngestStateError``
    (never silently ignored: starting over would send the whole file again)."""
    try:
        with open(state_path, "rb") as f:
            text = f.read(64 * 1024)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise IngestStateError(f"cannot read ingest state {state_path}: {exc.strerror}") from None
    try:
        doc = _StateDoc.model_validate_json(text)
    except ValidationError as exc:
        raise IngestStateError(f"{state_path} is not an ingest state file ({_field_errors(exc)})") from None
    if doc.schema_ != STATE_SCHEMA:
        raise IngestStateError(f"{state_path} has schema {doc.schema_!r}; expected {STATE_SCHEMA!r}")
    digest = bytes.fromhex(doc.line_sha256) if doc.line_sha256 else None
    return IngestState(FileId(doc.device, doc.inode), doc.offset, doc.line, doc.line_start, digest)


def save_state(state_path: str, state: IngestState, *, source_path: str | None = None) -> None:
    """Write the state atomically and durably: temp file, fsync, rename over, fsync of the folder."""
    doc = {
        "schema": STATE_SCHEMA,
        "path": os.path.abspath(source_path) if source_path else None,
        "device": state.file.device,
        "inode": state.file.inode,
        "offset": state.offset,
        "line": state.line,
        "lineStart": state.line_start,
        "lineSha256": state.line_sha256.hex() if state.line_sha256 else None,
        "savedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    folder = os.path.dirname(os.path.abspath(state_path))
    tmp = f"{state_path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(doc, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, state_path)
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# ------------------------------------------------------------------------------------------------ reading


def _holds_line(fh: IO[bytes], state: IngestState) -> bool:
    """Whether the file still holds, at the saved range, the line whose digest the state recorded."""
    if state.line_start is None or state.line_sha256 is None:
        return True  # nothing to check (an over-long line, or a state written without the check)
    fh.seek(state.line_start)
    data = fh.read(max(0, state.offset - state.line_start))
    line = data[:-1] if data.endswith(b"\n") else data
    return hashlib.sha256(line).digest() == state.line_sha256


@dataclass(frozen=True, slots=True)
class Line:
    """One complete line of input: its number, bytes (without the newline) and where it ends."""

    number: int
    data: bytes
    end: int  # byte offset just after the line (and its newline)
    file: FileId | None  # None for stdin
    too_long: int = 0  # when > 0 the line was longer than MAX_LINE_BYTES (its bytes were dropped)
    start: int = 0  # byte offset of the line's first byte


class _Stopped(Exception):
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
    ) -> None:
        self.path = path
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
                raise InputError(f"{self.path}: no such file", code="file_not_found") from None
            return False
        except OSError as exc:
            raise InputError(f"{self.path}: {exc.strerror}", code="file_unreadable") from None
        st = os.fstat(fh.fileno())
        self._fh, self.file = fh, FileId.of(st)
        self._pos, self._line = 0, 0
        self._partial.clear()
        self._too_long = 0
        if start is not None:
            if start.file != self.file:
                self._notice(f"{self.path}: the state names another file (rotated?); starting at line 1")
            elif st.st_size < start.offset:
                self._notice(f"{self.path}: shorter than the saved position (truncated?); starting at line 1")
            elif not _holds_line(fh, start):
                self._notice(f"{self.path}: no longer holds the saved line (rewritten?); starting at line 1")
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

    # -- reading

    def _take(self, chunk: bytes) -> Line | None:
        """Add bytes read; return a complete line when ``chunk`` ended one."""
        complete = chunk.endswith(b"\n")
        body = chunk[:-1] if complete else chunk
        if self._too_long or len(self._partial) + len(body) > MAX_LINE_BYTES:
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
            line = Line(self._line, b"", end, self.file, too_long=self._too_long, start=self._pos)
        else:
            line = Line(self._line, bytes(self._partial), end, self.file, start=self._pos)
        self._pos = end
        self._partial.clear()
        self._too_long = 0
        return line

    def _read_chunk(self) -> bytes:
        assert self._fh is not None
        # Small reads: BufferedReader.readline(limit) allocates ``limit`` bytes up front on every call.
        limit = min(_READ_BYTES, MAX_LINE_BYTES + 1 - len(self._partial)) if not self._too_long else _READ_BYTES
        self.blocking = self._stdin
        try:
            return self._fh.readline(max(1, limit))
        finally:
            self.blocking = False

    def lines(self) -> Iterator[Line]:
        """Complete lines available now; in follow mode stops at the current end (call again later)."""
        if self._fh is None:
            return
        while True:
            chunk = self._read_chunk()
            if not chunk:
                break
            # the bytes of an unfinished line stay in _partial; _pos is their start
            line = self._take(chunk)
            if line is not None:
                yield line
        if not self.follow or self._stdin:
            # the end of input: a last line without a newline is still a line
            if self._partial or self._too_long:
                yield self._emit(newline=False)
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
            return
        read_to = self._pos + len(self._partial) + self._too_long
        if st.st_size < read_to:
            self._notice(f"{self.path}: truncated; reading it again from its start")
            assert self._fh is not None
            self._fh.seek(0)
            self._pos, self._line = 0, 0
            self._partial.clear()
            self._too_long = 0

    def _drain_old(self) -> Iterator[Line]:
        while True:
            chunk = self._read_chunk()
            if not chunk:
                break
            line = self._take(chunk)
            if line is not None:
                yield line
        if self._partial or self._too_long:
            yield self._emit(newline=False)


# ------------------------------------------------------------------------------------------------ ingest


class Sender(Protocol):
    """What ingest needs of a producer (``TurnProducer`` is one)."""

    def send_async(self, turn: TurnRecord, *, validated: bool = False) -> Any:
        """Hand a turn over; the result has ``done`` and ``result()``."""
        ...

    def flush(self, timeout: float | None = None) -> None:
        """Wait for every handed-over turn."""
        ...


@dataclass
class IngestStats:
    """Counters of one ingest run."""

    lines_read: int = 0
    turns_sent: int = 0  # acknowledged by the broker
    rejected: int = 0
    started: float = 0.0

    def rate(self) -> float:
        """Lines read per second since the start."""
        elapsed = time.monotonic() - self.started
        return self.lines_read / elapsed if elapsed > 0 else 0.0


@dataclass(frozen=True, slots=True)
class _Mark:
    """What ingest keeps of a line while its turn is in flight: where it is, not its bytes."""

    number: int
    end: int
    file: FileId | None
    start: int
    sha256: bytes | None


@dataclass(slots=True)
class _Entry:
    line: _Mark
    pending: Any  # a PendingSend, or None for a blank or rejected line
    size: int = 0


class Ingest:
    """One ingest run: read lines, send turns, collect acknowledgements, save state, report."""

    def __init__(
        self,
        reader: LineReader,
        producer: Sender,
        *,
        state_path: str | None = None,
        stop: threading.Event | None = None,
        max_idle: float | None = None,
        progress: bool = False,
        err: IO[str] | None = None,
        producer_name: str = "throughline-ingest",
        producer_version: str = "0",
    ) -> None:
        self.reader = reader
        self.producer = producer
        self.state_path = state_path
        self.stop = stop or threading.Event()
        self.max_idle = max_idle
        self.progress = progress
        self.err = err or sys.stderr
        self.producer_name = producer_name
        self.producer_version = producer_version
        self.stats = IngestStats(started=time.monotonic())
        self._inflight: deque[_Entry] = deque()
        self._inflight_bytes = 0
        self._covered: _Mark | None = None  # last line all of whose predecessors are acknowledged/rejected
        self._saved: _Mark | None = None
        self._last_save = 0.0
        self._last_progress = time.monotonic()

    # -- reporting

    def _say(self, text: str) -> None:
        print(text, file=self.err, flush=True)

    def _reject(self, line: Line | _Mark, error: ThroughlineError) -> None:
        self.stats.rejected += 1
        self._say(f"line {line.number}: {error.code}: {error.message}")

    def _maybe_progress(self, force: bool = False) -> None:
        if not self.progress:
            return
        now = time.monotonic()
        if force or now - self._last_progress >= PROGRESS_INTERVAL:
            self._last_progress = now
            s = self.stats
            self._say(
                f"progress: {s.lines_read} lines read, {s.turns_sent} turns sent, "
                f"{s.rejected} rejected, {s.rate():.0f} lines/s"
            )

    # -- acknowledgements and state

    def _collect(self, *, wait: bool) -> None:
        """Move the covered position over every finished entry at the front (all of them when ``wait``)."""
        while self._inflight:
            entry = self._inflight[0]
            if entry.pending is not None:
                if not wait and not entry.pending.done:
                    break
                try:
                    entry.pending.result()
                    self.stats.turns_sent += 1
                except SendFailedError as exc:
                    if exc.retriable:
                        raise
                    self._reject(entry.line, exc)  # the broker refuses this record for good; go on
            self._inflight.popleft()
            self._inflight_bytes -= entry.size
            self._covered = entry.line

    def save(self, *, force: bool = False) -> None:
        """Write the state when it moved (at most every ``STATE_SAVE_INTERVAL`` unless ``force``)."""
        if self.state_path is None or self._covered is None or self._covered is self._saved:
            return
        if self._covered.file is None:
            return
        now = time.monotonic()
        if not force and now - self._last_save < STATE_SAVE_INTERVAL:
            return
        line = self._covered
        assert line.file is not None
        state = IngestState(line.file, line.end, line.number, line.start, line.sha256)
        try:
            save_state(self.state_path, state, source_path=self.reader.path)
        except OSError as exc:
            raise ProducerError(
                f"cannot write ingest state {self.state_path}: {exc.strerror or exc}", code="state_write_failed"
            ) from exc
        self._saved, self._last_save = line, now

    # -- the loop

    def _handle(self, line: Line) -> None:
        self.stats.lines_read += 1
        digest = None if line.too_long or line.file is None else hashlib.sha256(line.data).digest()
        mark = _Mark(line.number, line.end, line.file, line.start, digest)
        pending = None
        if line.too_long:
            self._reject(line, InvalidLineError(
                f"line is longer than {MAX_LINE_BYTES} bytes ({line.too_long} bytes)", code="line_too_long"
            ))
        else:
            try:
                turn = parse_turn_line(
                    line.data,
                    producer_name=self.producer_name,
                    producer_version=self.producer_version,
                    produced_at_micros=time.time_ns() // 1000,
                    attributes={"ingest.line": str(line.number)},
                )
            except InputError as exc:
                self._reject(line, exc)
            else:
                if turn is not None:
                    try:
                        pending = self.producer.send_async(turn, validated=True)
                    except SendFailedError as exc:
                        if exc.retriable:
                            raise
                        self._reject(line, exc)
        if pending is None and not self._inflight:
            self._covered = mark  # nothing in flight before it: a blank or rejected line is covered at once
        else:
            size = len(line.data) if pending is not None else 0
            self._inflight.append(_Entry(mark, pending, size))
            self._inflight_bytes += size
        if len(self._inflight) >= MAX_IN_FLIGHT or self._inflight_bytes >= MAX_IN_FLIGHT_BYTES:
            self._collect(wait=True)

    def _settle(self) -> None:
        self.producer.flush()
        self._collect(wait=True)

    def run(self) -> IngestStats:
        """Ingest until the end of input (or, following, until stopped or idle for ``max_idle``)."""
        idle_since = time.monotonic()
        try:
            while not self.stop.is_set():
                got = False
                try:
                    for line in self.reader.lines():
                        got = True
                        self._handle(line)
                        self._collect(wait=False)
                        self.save()
                        self._maybe_progress()
                        if self.stop.is_set():
                            break
                except _Stopped:
                    break
                if self.stop.is_set():
                    break
                if not self.reader.follow or self.reader.eof:
                    break
                for line in self.reader.check_file():
                    got = True
                    self._handle(line)
                now = time.monotonic()
                if got:
                    idle_since = now
                # Idle: everything handed over so far is acknowledged before the state is written.
                self._settle()
                self.save(force=True)
                self._maybe_progress()
                if self.max_idle is not None and now - idle_since >= self.max_idle:
                    break
                self.stop.wait(self.reader.poll_interval)
            self._settle()
        finally:
            # Whatever happened, record what is certainly in the log (never more).
            try:
                self._collect(wait=False)
            except ThroughlineError:
                pass  # the failure that matters is already on its way up
            finally:
                self.save(force=True)
                self.reader.close()
        self._maybe_progress(force=True)
        return self.stats


# ------------------------------------------------------------------------------------------------ signals


class StopOnSignals:
    """Turn SIGINT/SIGTERM into a stop request while ingesting (restored on exit).

    The first signal sets ``stop``; ingest then flushes, saves its state and returns. A blocking read
    of stdin is interrupted at once. A second signal interrupts whatever is running.
    """

    def __init__(self, stop: threading.Event, reader: LineReader | None = None) -> None:
        self.stop = stop
        self.reader = reader
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.stop.is_set():
            raise KeyboardInterrupt
        self.signum = signum
        self.stop.set()
        if self.reader is not None and self.reader.blocking:
            raise _Stopped

    def __enter__(self) -> StopOnSignals:
        import signal

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        import signal

        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
