"""The in-memory adapters of the core's ports, for pure tests of the reader (no DuckDB, no Kafka).

``BookProjection`` is a ``Projection`` over the reference fold (``ChainBook``); ``FixedLog`` is a
``LogView`` whose end offsets the test sets. The contract test class of the projection port
(tests/unit/test_projection_contract.py) runs against ``BookProjection`` and ``DuckProjection`` alike.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from throughline.core.cursor import Cursor
from throughline.core.fold import ChainBook
from throughline.core.inflight import InFlight
from throughline.core.partitioning import partition_for
from throughline.core.ports import (
    ProjectionView,
    QuarantineReport,
    SourceInfo,
    StoredTurn,
    T,
    cursor_of,
    stored_turn,
    turns_each,
)
from throughline.core.repair import RepairRecord
from throughline.core.turn import TurnRecord


@dataclass
class _BookView:
    book: ChainBook
    applied: dict[int, int]
    projects: dict[bytes, bytes]

    def applied_offset(self, partition: int) -> int:
        return self.applied.get(partition, 0)

    def head(self, project_sha256: bytes) -> Cursor | None:
        source = self.book.heads.get(project_sha256)
        if source is None or not self.book.live.get(source):
            return None
        return cursor_of(project_sha256, source, self.book.live[source][-1])

    def source(self, source_sha256: bytes) -> SourceInfo | None:
        if source_sha256 not in self.book.live:
            return None
        head = self.book.head_of(source_sha256)
        broken = "quarantined record" if source_sha256 in self.book.broken else None
        return SourceInfo(self.projects[source_sha256], source_sha256, head.length, head.chain_digest, broken)

    def turns(self, source_sha256: bytes, first_seq: int, last_seq: int) -> list[StoredTurn]:
        live = self.book.live.get(source_sha256, [])
        return [stored_turn(t) for t in live[max(0, first_seq - 1) : max(0, last_seq)]]

    def turns_many(self, ranges: Sequence[tuple[bytes, int, int]]) -> list[list[StoredTurn]]:
        return turns_each(self, ranges)


@dataclass
class BookProjection:
    """An in-memory projection over a ``ChainBook``, for pure tests of the reader.

    ``apply`` folds a record and advances the applied offset of its partition, as the projector does.
    """

    book: ChainBook = field(default_factory=ChainBook)
    applied: dict[int, int] = field(default_factory=dict)
    _projects: dict[bytes, bytes] = field(default_factory=dict)
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _inflight: InFlight = field(default_factory=InFlight)
    _changes: dict[bytes, int] = field(default_factory=dict)

    def apply(self, record: TurnRecord | RepairRecord, partition: int, offset: int) -> None:
        """Fold one record (a turn or a repair) at (partition, offset)."""
        with self._changed:
            self.book.apply_record(record, partition, offset)
            if isinstance(record, TurnRecord):
                self._projects.setdefault(record.source_sha256, record.project_sha256)
            self.applied[partition] = offset + 1
            self._inflight.applied(partition, offset + 1)
            self._changes[record.project_sha256] = self._changes.get(record.project_sha256, 0) + 1
            self._changed.notify_all()

    def fetching_from(self, offsets: dict[int, int]) -> None:
        """The feed (re)starts at ``offsets``: nothing is in flight (as ``DuckProjection.fetching_from``)."""
        with self._changed:
            self._inflight.start(offsets)

    def fetched(self, partition: int, records: list[tuple[int, bytes | None]], next_offset: int) -> None:
        """Records (offset, project) fetched and about to be applied (as ``DuckProjection.fetched``)."""
        with self._changed:
            self._inflight.add(partition, records, next_offset)
            self._changed.notify_all()

    def project_changes(self, project_sha256: bytes) -> int:
        """Records applied to the project so far (as ``DuckProjection.project_changes``)."""
        with self._changed:
            return self._changes.get(project_sha256, 0)

    def wait_project_changed(self, project_sha256: bytes, seen: int, timeout: float) -> bool:
        """Wait until ``project_changes`` exceeds ``seen`` (as ``DuckProjection.wait_project_changed``)."""
        with self._changed:
            return self._changed.wait_for(lambda: self._changes.get(project_sha256, 0) > seen, max(0.0, timeout))

    def wait_settled(self, partition: int, project_sha256: bytes, offset: int, timeout: float) -> bool:
        """Wait until no record of the project below ``offset`` is unapplied, as far as it can prove."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._inflight.settled(partition, project_sha256, offset, self.applied.get(partition, 0)),
                max(0.0, timeout),
            )

    @contextmanager
    def view(self) -> Iterator[ProjectionView]:
        """A snapshot (copies the small maps; the book is only read under the lock)."""
        with self._changed:
            snapshot = ChainBook(
                live={k: list(v) for k, v in self.book.live.items()},
                applied={k: dict(v) for k, v in self.book.applied.items()},
                heads=dict(self.book.heads),
                broken=set(self.book.broken),
            )
            view = _BookView(snapshot, dict(self.applied), dict(self._projects))
        yield view

    def read(self, answer: Callable[[ProjectionView], T]) -> T:
        """``answer`` of ``view``: a copied snapshot is never overtaken."""
        with self.view() as view:
            return answer(view)

    def readable_offsets(self) -> dict[int, int]:
        """The applied offsets (nothing is staged ahead of ``apply``)."""
        with self._changed:
            return dict(self.applied)

    def committed_offsets(self) -> None:
        """``None``: every applied record is committed at once."""
        return None

    def quarantine(self, project_sha256: bytes | None = None, *, times: bool = True) -> QuarantineReport | None:
        """``None``: the book keeps broken marks, not a listing of quarantined records."""
        return None

    def wait_applied(self, partition: int, offset: int, timeout: float) -> bool:
        """Wait until the partition's applied offset reaches ``offset``."""
        with self._changed:
            return self._changed.wait_for(lambda: self.applied.get(partition, 0) >= offset, max(0.0, timeout))


@dataclass
class FixedLog:
    """An in-memory log view: a fixed partition count and end offsets set by the test."""

    partitions: int = 1
    ends: dict[int, int] = field(default_factory=dict)

    def partition_of(self, project_sha256: bytes) -> int:
        """Kafka's default partitioner over the project hash."""
        return partition_for(project_sha256, self.partitions)

    def end_offset(self, partition: int) -> int:
        """The end offset the test set (0 by default)."""
        return self.ends.get(partition, 0)

    def end_offsets(self, partitions: Sequence[int] | None = None) -> dict[int, int]:
        """The end offsets the test set, of ``partitions`` (every partition by default)."""
        wanted = range(self.partitions) if partitions is None else partitions
        return {p: self.end_offset(p) for p in wanted}
