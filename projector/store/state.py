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


class SourceState:
    """A source's committed head and health (cached between batches)."""

    __slots__ = (
        "broken_offset",
        "broken_partition",
        "broken_reason",
        "chain_digest",
        "head_offset",
        "head_partition",
        "length",
        "project",
    )

    def __init__(
        self,
        project: bytes,
        length: int = 0,
        chain_digest: bytes = CHAIN_ORIGIN,
        head_partition: int | None = None,
        head_offset: int | None = None,
        broken_reason: str | None = None,
        broken_partition: int | None = None,
        broken_offset: int | None = None,
    ) -> None:
        self.project = project
        self.length = length
        self.chain_digest = chain_digest
        self.head_partition = head_partition
        self.head_offset = head_offset
        self.broken_reason = broken_reason
        self.broken_partition = broken_partition
        self.broken_offset = broken_offset

    def copy(self) -> SourceState:
        """A working copy for a batch to fold into."""
        return SourceState(
            self.project,
            self.length,
            self.chain_digest,
            self.head_partition,
            self.head_offset,
            self.broken_reason,
            self.broken_partition,
            self.broken_offset,
        )

    def chain_head(self) -> ChainHead:
        """What a read needs of this state."""
        return ChainHead(
            self.project, self.length, self.chain_digest, self.head_partition, self.head_offset, self.broken_reason
        )

    def row(self, source: bytes) -> tuple[Any, ...]:
        """The ``sources`` row of ``source`` in this state (columns in the table's order)."""
        return (
            source,
            self.project,
            self.length,
            self.chain_digest,
            self.head_partition,
            self.head_offset,
            self.broken_reason,
            self.broken_partition,
            self.broken_offset,
        )


@dataclass
class PartitionCounters:
    """A partition's next offset to apply and what its applied records did (``applied_offsets``)."""

    next_offset: int = 0
    records: int = 0
    appended: int = 0
    rewinds: int = 0
    duplicates: int = 0
    quarantined: int = 0

    def add(self, s: BatchSummary) -> PartitionCounters:
        """These counters plus what a batch did (the next offset is the caller's to set)."""
        return PartitionCounters(
            self.next_offset,
            self.records + s.records,
            self.appended + s.appended,
            self.rewinds + s.rewinds,
            self.duplicates + s.duplicates,
            self.quarantined + s.quarantined,
        )
