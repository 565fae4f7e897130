"""The writer's state between batches: each source's chain head and health (the projection's source
cache, and each batch's working copy), and each partition's applied offset and counters.

Mutable on purpose: a batch folds into copies of these (``SourceState.copy``) and the projection
takes them over only after the batch commits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from throughline.core.chain import CHAIN_ORIGIN
from throughline.projector.read_index import ChainHead
from throughline.projector.store.values import BatchSummary


@dataclass(slots=True)
class SourceState:
    """A source's committed head and health (cached between batches)."""

    project_sha256: bytes
    length: int = 0
    chain_digest: bytes = CHAIN_ORIGIN
    head_partition: int | None = None
    head_offset: int | None = None
    broken_reason: str | None = None
    broken_partition: int | None = None
    broken_offset: int | None = None

    def values(self) -> tuple[Any, ...]:
        """The fields in order (the constructor's, and the ``sources`` columns after the source)."""
        return (
            self.project_sha256,
            self.length,
            self.chain_digest,
            self.head_partition,
            self.head_offset,
            self.broken_reason,
            self.broken_partition,
            self.broken_offset,
        )

    def copy(self) -> SourceState:
        """A working copy for a batch to fold into."""
        return SourceState(*self.values())

    def chain_head(self) -> ChainHead:
        """What a read needs of this state."""
        return ChainHead(
            self.project_sha256,
            self.length,
            self.chain_digest,
            self.head_partition,
            self.head_offset,
            self.broken_reason,
        )

    def row(self, source: bytes) -> tuple[Any, ...]:
        """The ``sources`` row of ``source`` in this state (columns in the table's order)."""
        return (source, *self.values())


@dataclass
class PartitionCounters:
    """A partition's next offset to apply and what its applied records did (``applied_offsets``)."""

    next_offset: int = 0
    applied: BatchSummary = BatchSummary()

    def add(self, s: BatchSummary) -> PartitionCounters:
        """These counters plus what a batch did (the next offset is the caller's to set)."""
        return PartitionCounters(self.next_offset, self.applied + s)


def read_counters(con: Any, topic: str | None) -> dict[int, PartitionCounters]:
    """Each partition's committed counters, as ``applied_offsets`` holds them for ``topic``."""
    rows = con.execute(
        "SELECT log_partition, next_offset, records, appended, rewinds, duplicates, quarantined "
        "FROM applied_offsets WHERE topic = ?",
        [topic or ""],
    ).fetchall()
    return {int(r[0]): PartitionCounters(int(r[1]), BatchSummary(*(int(x) for x in r[2:]))) for r in rows}
