"""One ingest run: read lines, send turns, collect acknowledgements, save state, report.

A bad line is reported on stderr as ``line N: CODE: message`` and does not stop the good lines.

Resuming: every line up to the one the state names was either acknowledged by the broker or rejected,
so a restart resumes right after it and neither skips nor re-sends a line. A restart reads the file from
0 instead when the path now names another file, when the file is shorter than the offset, or when the
recorded line is no longer where the state says (the file was rewritten in place while ingest was
stopped, e.g. by ``logrotate copytruncate``). The one remaining window: a crash after the broker
acknowledged turns but before the state recording them was written re-sends those turns on restart;
the projector applies a re-sent turn id once (same content: ``Duplicate``), so the chains do not change.
Lines appended to a file after it was rotated away while ingest was stopped are not found on restart
(ingest starts the new file at 0).
"""

from __future__ import annotations

import hashlib
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any, Protocol

from throughline.core.turn import TurnRecord
from throughline.errors import InputError, ThroughlineError
from throughline.producers.exceptions import (
    LineTooLongError,
    SendFailedError,
    StateWriteFailedError,
)
from throughline.producers.ingest.jsonl import MAX_LINE_BYTES, parse_turn_line
from throughline.producers.ingest.state import FileId, IngestState, save_ingest_state
from throughline.producers.ingest.tail import Line, LineReader, Stopped
from throughline.runtime import StopOnSignals

STATE_SAVE_INTERVAL = 0.5
PROGRESS_INTERVAL = 2.0
#: Turns handed to the producer whose acknowledgement has not been collected yet (backpressure: when
#: either bound is reached, ingest waits for them). kafka-python 3 has no bounded send buffer of its own.
MAX_IN_FLIGHT = 10_000
MAX_IN_FLIGHT_BYTES = 64 * 1024 * 1024


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
class LineMark:
    """What ingest keeps of a line while its turns are in flight: where it is, not its bytes."""

    number: int
    end: int
    file: FileId | None
    start: int
    sha256: bytes | None
    path: str = ""
    settled: bool = False  # the mark of a settle (``Line.settle``): after the line, not the line itself

    def state(self) -> IngestState | None:
        """The resume state that covers this line (``None`` for standard input)."""
        if self.file is None:
            return None
        return IngestState(self.file, self.end, self.number, self.start, self.sha256)


class LineSource(Protocol):
    """Where ingest reads lines from: one file (``LineReader``) or many (``SessionFiles``)."""

    path: str
    follow: bool
    eof: bool
    poll_interval: float

    def lines(self) -> Iterator[Line]:
        """Complete lines available now."""
        ...

    def check_file(self) -> Iterator[Line]:
        """Following: notice truncation, rotation, new files (may yield the last lines of an old file)."""
        ...

    def close(self) -> None:
        """Release the files."""
        ...


class LineDecoder(Protocol):
    """How a line becomes turns (``InputError`` rejects the line)."""

    def turns(self, line: Line) -> list[TurnRecord]:
        """The turns a line holds or completes (none for a blank line)."""
        ...

    def label(self, line: Line | LineMark) -> str:
        """How a line is named in a report."""
        ...


class StateWriter(Protocol):
    """Saves the resume state: the last covered line of each file."""

    def write(self, covered: Mapping[str, LineMark]) -> None:
        """Write the state durably (``OSError`` when it cannot)."""
        ...


class JsonLinesDecoder:
    """The JSON Lines format of ``throughline ingest`` (one turn a line, ``parse_turn_line``)."""

    def __init__(self, producer_name: str = "throughline-ingest", producer_version: str = "0") -> None:
        self.producer_name = producer_name
        self.producer_version = producer_version

    def turns(self, line: Line) -> list[TurnRecord]:
        """The line's turn (none for a blank line); ``InputError`` for a bad line."""
        if line.too_long:
            raise LineTooLongError(f"line is longer than {MAX_LINE_BYTES} bytes ({line.too_long} bytes)")
        turn = parse_turn_line(
            line.data,
            producer_name=self.producer_name,
            producer_version=self.producer_version,
            produced_at_micros=time.time_ns() // 1000,
            attributes={"ingest.line": str(line.number)},
        )
        return [] if turn is None else [turn]

    def label(self, line: Line | LineMark) -> str:
        """``line N``."""
        return f"line {line.number}"


class SingleFileState:
    """The ingest state file of one ingested file (``throughline.ingest_state.v1``)."""

    def __init__(self, state_path: str, source_path: str) -> None:
        self.state_path = state_path
        self.source_path = source_path

    def write(self, covered: Mapping[str, LineMark]) -> None:
        """Save the covered line of the one file (nothing for standard input)."""
        mark = covered.get(self.source_path)
        state = mark.state() if mark is not None else None
        if state is not None:
            save_ingest_state(self.state_path, state, source_path=self.source_path)


@dataclass(slots=True)
class _Entry:
    line: LineMark
    pending: list[Any]  # PendingSends; empty for a blank or rejected line or one that completes no turn
    size: int = 0


class Ingest:
    """One ingest run: read lines, send turns, collect acknowledgements, save state, report."""

    def __init__(
        self,
        reader: LineSource,
        producer: Sender,
        *,
        state_path: str | None = None,
        stop: threading.Event | None = None,
        max_idle: float | None = None,
        progress: bool = False,
        err: IO[str] | None = None,
        producer_name: str = "throughline-ingest",
        producer_version: str = "0",
        decoder: LineDecoder | None = None,
        state: StateWriter | None = None,
    ) -> None:
        self.reader = reader
        self.producer = producer
        self.state_path = state_path
        self.stop = stop or threading.Event()
        self.max_idle = max_idle
        self.progress = progress
        self.err = err or sys.stderr
        self.decoder = decoder or JsonLinesDecoder(producer_name, producer_version)
        if state is None and state_path is not None:
            state = SingleFileState(state_path, reader.path)
        self.state = state
        self.stats = IngestStats(started=time.monotonic())
        self._inflight: deque[_Entry] = deque()
        self._inflight_bytes = 0
        # per file: the last line all of whose predecessors are acknowledged or rejected
        self._covered: dict[str, LineMark] = {}
        self._last: dict[str, LineMark] = {}  # per file: the mark of the last line read (a settle reuses it)
        self._saved: dict[str, LineMark] = {}
        self._last_save = 0.0
        self._last_progress = time.monotonic()

    # -- reporting

    def _say(self, text: str) -> None:
        # A line on the report stream the caller hands over (the command's stderr), whole and at once.
        self.err.write(text + "\n")
        self.err.flush()

    def _reject(self, line: Line | LineMark, error: ThroughlineError) -> None:
        self.stats.rejected += 1
        self._say(f"{self.decoder.label(line)}: {error.code}: {error.message}")

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

    @property
    def in_flight(self) -> int:
        """Lines whose turns are handed over but not all acknowledged yet."""
        return len(self._inflight)

    def covered(self) -> dict[str, LineMark]:
        """The last covered line of each file so far."""
        return dict(self._covered)

    def covered_line(self, path: str) -> LineMark | None:
        """The last covered line (or settle) of one file so far."""
        return self._covered.get(path)

    def _collect(self, *, wait: bool) -> None:
        """Move the covered position over every finished entry at the front (all of them when ``wait``)."""
        while self._inflight:
            entry = self._inflight[0]
            if not wait and not all(p.done for p in entry.pending):
                break
            for pending in entry.pending:
                try:
                    pending.result()
                    self.stats.turns_sent += 1
                except SendFailedError as exc:
                    if exc.retriable:
                        raise
                    self._reject(entry.line, exc)  # the broker refuses this record for good; go on
            self._inflight.popleft()
            self._inflight_bytes -= entry.size
            self._covered[entry.line.path] = entry.line

    def save(self, *, force: bool = False) -> None:
        """Write the state when it moved (at most every ``STATE_SAVE_INTERVAL`` unless ``force``)."""
        if self.state is None or self._covered == self._saved:
            return
        now = time.monotonic()
        if not force and now - self._last_save < STATE_SAVE_INTERVAL:
            return
        covered = dict(self._covered)
        try:
            self.state.write(covered)
        except OSError as exc:
            raise StateWriteFailedError(f"cannot write ingest state {self.state_path}: {exc.strerror or exc}") from exc
        self._saved, self._last_save = covered, now

    # -- the loop

    def _mark(self, line: Line) -> LineMark:
        if line.settle:
            # Covers the same line as the line's own mark (with its digest), and the settle after it.
            last = self._last.get(line.path)
            digest = last.sha256 if last is not None and last.end == line.end else None
            return LineMark(line.number, line.end, line.file, line.start, digest, line.path, settled=True)
        self.stats.lines_read += 1
        digest = None if line.too_long or line.file is None else hashlib.sha256(line.data).digest()
        mark = self._last[line.path] = LineMark(line.number, line.end, line.file, line.start, digest, line.path)
        return mark

    def _handle(self, line: Line) -> None:
        mark = self._mark(line)
        pending: list[Any] = []
        size = 0
        try:
            turns = self.decoder.turns(line)
        except InputError as exc:
            self._reject(line, exc)
        else:
            for turn in turns:
                try:
                    pending.append(self.producer.send_async(turn, validated=True))
                    size += len(turn.body)
                except SendFailedError as exc:
                    if exc.retriable:
                        raise
                    self._reject(line, exc)
        if not pending and not self._inflight:
            self._covered[mark.path] = mark  # nothing in flight before it: covered at once
        else:
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
                except Stopped:
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


def stop_on_signals(stop: threading.Event, reader: LineReader | None = None) -> StopOnSignals:
    """SIGINT/SIGTERM while ingesting (``throughline.runtime.StopOnSignals``, restored on exit).

    The first signal sets ``stop``; ingest then flushes, saves its state and returns. A blocking read
    of stdin is interrupted at once. A second signal interrupts whatever is running.
    """

    def first(_signum: int) -> None:
        stop.set()
        if reader is not None and reader.blocking:
            raise Stopped

    return StopOnSignals(first)
