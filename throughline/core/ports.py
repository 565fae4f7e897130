"""Ports between the pure core and the edges (DuckDB projection, Kafka log).

The reader depends only on these protocols and their value types. Each has a real adapter at the edge
(``throughline.projector.store`` for DuckDB, ``throughline.log`` for Kafka) and an in-memory adapter
in ``throughline.core.memory`` (``BookProjection``, ``FixedLog``), and one contract test class runs
against both.

Every capability a reader or the serve API uses is declared here, with what it guarantees about threads
and lifetimes, and every adapter implements all of them: a caller never asks an adapter whether it has a
method. Where an adapter has nothing to add (an in-memory projection stages nothing ahead of its
commits, so it has no committed offsets apart from the readable ones) the method says so in its answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, TypeVar

from throughline.core.cursor import Cursor
from throughline.core.fold import BookTurn

T = TypeVar("T")


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
    """One consistent snapshot of the projection: every method reads the same committed state.

    A view lives only inside the ``with`` block of the ``Projection.view`` that yielded it (or the call of
    ``Projection.read`` it was handed to), and is used by the one thread that entered that block.
    """

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

    def turns_many(self, ranges: Sequence[tuple[bytes, int, int]]) -> list[list[StoredTurn]]:
        """``turns`` of each (source, first seq, last seq), in the order asked, all of this one snapshot.

        The DuckDB view answers every range with one statement; an adapter without a multi-range read
        answers range by range (``turns_each``).
        """
        ...


def turns_each(view: ProjectionView, ranges: Sequence[tuple[bytes, int, int]]) -> list[list[StoredTurn]]:
    """``view.turns`` of each (source, first seq, last seq), range by range: ``turns_many`` of a view that
    has no multi-range read of its own."""
    return [view.turns(source, first, last) for source, first, last in ranges]


class QuarantineReport(Protocol):
    """What a projection lists of its quarantine: records in log order, broken sources, applied repairs."""

    @property
    def records(self) -> Sequence[object]:
        """Quarantined records (each with ``code`` and ``repaired_by``)."""
        ...

    @property
    def broken(self) -> Sequence[object]:
        """Sources with a broken mark (each with ``code``)."""
        ...

    @property
    def repairs(self) -> Sequence[object]:
        """Applied repairs (each with ``outcome``)."""
        ...


class Projection(Protocol):
    """A projection the reader can take snapshots of and wait on.

    Every method is safe to call from any thread, concurrently with the projector writing in the same
    process. After the projection is closed, waits return at once (their condition as it stands) and
    ``view``/``read`` raise.
    """

    def view(self) -> AbstractContextManager[ProjectionView]:
        """A context manager yielding one consistent snapshot."""
        ...

    def read(self, answer: Callable[[ProjectionView], T]) -> T:
        """``answer`` of one consistent snapshot, the way this adapter answers cheapest: the answer is always
        of one version. ``answer`` may be called more than once (a cheaper view that a commit overtook is
        thrown away inside the adapter and ``answer`` asked again), so it must have no effect beyond its
        result; whatever it raises propagates.

        The DuckDB projection reads without a transaction while no commit is under way; an adapter whose
        views cannot be overtaken answers in ``view()``.
        """
        ...

    def readable_offsets(self) -> Mapping[int, int]:
        """How far reads answer per partition right now (partitions never reached are absent): the applied
        offsets, or past them where records were staged for readers before their commit. A new mapping
        the caller owns, read without a snapshot."""
        ...

    def committed_offsets(self) -> Mapping[int, int] | None:
        """How far the projection's storage holds the records per partition, when that can differ from
        ``readable_offsets`` (records staged before their commit); ``None`` for a projection that stages
        nothing ahead of its commits."""
        ...

    def quarantine(self, project_sha256: bytes | None = None, *, times: bool = True) -> QuarantineReport | None:
        """Every quarantined record, broken source and applied repair (of one project, or of all) as committed
        (``committed_offsets``), read in one snapshot; ``times=False`` may skip decoding when each record
        was produced. ``None``: this projection keeps no quarantine listing."""
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
    """What the reader needs to know about the log right now.

    Safe to call from any thread; each answer is asked of the log at the call (never cached), and a call
    may raise a ``LogError`` when the log does not answer.
    """

    def partition_of(self, project_sha256: bytes) -> int:
        """The partition that holds the project's records."""
        ...

    @property
    def partitions(self) -> int:
        """The topic's partition count (fixed for the view's lifetime)."""
        ...

    def end_offset(self, partition: int) -> int:
        """The partition's end offset (the offset the next record will get) at the time of the call."""
        ...

    def end_offsets(self, partitions: Sequence[int] | None = None) -> dict[int, int]:
        """End offsets of ``partitions`` (every partition by default) at the time of the call, asked at once."""
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
