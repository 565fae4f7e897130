"""Ports between the pure core and the edges (DuckDB projection, Kafka log).

The reader depends only on these protocols and their value types. Each has a real adapter at the edge
(``throughline.projector.store`` for DuckDB, ``throughline.log`` for Kafka) and an in-memory adapter
in ``throughline.core.memory`` (``BookProjection``, ``FixedLog``), and one contract test class runs
against both.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from throughline.core.cursor import Cursor
from throughline.core.fold import BookTurn


@dataclass(frozen=True, slots=True)
class StoredTurn:
    """A live turn of a chain as the projection holds it."""

    seq: int
    turn_id: str
    completed_at_micros: int
    body: str
    body_bytes: int
    content_digest: bytes
    chain_digest: bytes
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """A source's chain head and health as the projection holds it."""

    project_sha256: bytes
    source_sha256: bytes
    length: int
    chain_digest: bytes
    broken_reason: str | None  # set once a record of this source was quarantined


class ProjectionView(Protocol):
    """One consistent snapshot of the projection: every method reads the same committed state."""

    def applied_offset(self, partition: int) -> int:
        """The next offset the projector will apply on ``partition`` (0 when nothing was applied)."""
        ...

    def head(self, project_sha256: bytes) -> Cursor | None:
        """The project's head source's full chain as a cursor, or ``None`` when it has no turns."""
        ...

    def source(self, source_sha256: bytes) -> SourceInfo | None:
        """The state of one source's chain, or ``None`` when the projection has never seen it."""
        ...

    def turns(self, source_sha256: bytes, first_seq: int, last_seq: int) -> list[StoredTurn]:
        """Live turns with ``first_seq <= seq <= last_seq``, ascending (rows missing are simply absent)."""
        ...


def read_turn_ranges(view: ProjectionView, ranges: Sequence[tuple[bytes, int, int]]) -> list[list[StoredTurn]]:
    """``view.turns`` of each (source, first seq, last seq), in one read when the view can.

    A view with a ``turns_many`` method (the DuckDB projection's: one statement for all the ranges)
    answers them together; any other is asked range by range.
    """
    many = getattr(view, "turns_many", None)
    if callable(many):
        answered: list[list[StoredTurn]] = many(ranges)
        return answered
    return [view.turns(source, first, last) for source, first, last in ranges]


class Projection(Protocol):
    """A projection the reader can take snapshots of and wait on."""

    def view(self) -> AbstractContextManager[ProjectionView]:
        """A context manager yielding one consistent snapshot."""
        ...

    def wait_applied(self, partition: int, offset: int, timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until ``applied_offset(partition) >= offset``."""
        ...

    def wait_settled(self, partition: int, project_sha256: bytes, offset: int, timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until no record of the project on ``partition`` below
        ``offset`` is unapplied, as far as the projection can prove it.

        A projection fed by a projector in its own process knows the projects of the records fetched
        but not applied yet (``throughline.core.inflight``), so other projects' records need not be
        waited for; one that cannot tell waits as ``wait_applied``.
        """
        ...

    def project_changes(self, project_sha256: bytes) -> int:
        """How many commits of this process changed the project's chains so far (appends, rewinds,
        broken marks); a count that only grows, and that stays 0 where nothing writes."""
        ...

    def wait_project_changed(self, project_sha256: bytes, seen: int, timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until ``project_changes(project_sha256) > seen``.

        A long-poll waits on this, so it is woken (and reads again) only by its own project's commits,
        not by every commit of the partition.
        """
        ...


class LogView(Protocol):
    """What the reader needs to know about the log right now."""

    def partition_of(self, project_sha256: bytes) -> int:
        """The partition that holds the project's records."""
        ...

    def end_offset(self, partition: int) -> int:
        """The partition's end offset (the offset the next record will get) at the time of the call."""
        ...


def cursor_of(project_sha256: bytes, source_sha256: bytes, turn: BookTurn | StoredTurn) -> Cursor:
    """The cursor naming the prefix that ends with ``turn``."""
    return Cursor(project_sha256, source_sha256, turn.seq, turn.chain_digest, turn.partition, turn.offset)


def stored_turn(turn: BookTurn) -> StoredTurn:
    """A turn of the reference fold as a projection stores it (the in-memory projection's rows)."""
    body = turn.record.body
    return StoredTurn(
        turn.seq,
        turn.turn_id,
        turn.record.completed_at_micros,
        body,
        len(body.encode("utf-8")),
        turn.content_digest,
        turn.chain_digest,
        turn.partition,
        turn.offset,
    )
