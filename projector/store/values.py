"""The store's value types: what an apply did, and what the operator reads of a projection (frozen)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class BatchSummary:
    """What applying some records did (also the counters kept per partition)."""

    records: int = 0
    appended: int = 0
    rewinds: int = 0
    duplicates: int = 0
    quarantined: int = 0

    def __add__(self, other: BatchSummary) -> BatchSummary:
        return BatchSummary(
            self.records + other.records,
            self.appended + other.appended,
            self.rewinds + other.rewinds,
            self.duplicates + other.duplicates,
            self.quarantined + other.quarantined,
        )


@dataclass(frozen=True, slots=True)
class RepairEntry:
    """A repair record the projector applied, with its outcome (``throughline.core.repair``)."""

    partition: int
    offset: int
    project_sha256: bytes
    source_sha256: bytes
    reason: str
    outcome: str
    marked: int  # quarantined records it marked repaired
    length: int  # the chain as applied that it accepted
    produced_at_micros: int


@dataclass(frozen=True, slots=True)
class QuarantineEntry:
    """One quarantined record, without its raw bytes.

    ``produced_at_micros``: when its producer wrote it (``None`` when it does not decode);
    ``repaired_by``: the (partition, offset) of the repair record that marked it, if one did.
    """

    partition: int
    offset: int
    code: str
    reason: str
    project_sha256: bytes | None
    source_sha256: bytes | None
    value_bytes: int
    produced_at_micros: int | None = None
    repaired_by: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class BrokenSource:
    """A source with a broken mark: its chain as applied, and the record that broke it (and its code)."""

    source_sha256: bytes
    project_sha256: bytes
    length: int
    reason: str
    partition: int | None
    offset: int | None
    code: str | None


@dataclass(frozen=True, slots=True)
class QuarantineListing:
    """What ``throughline quarantine`` lists: quarantined records in log order, broken sources, repairs."""

    records: tuple[QuarantineEntry, ...]
    broken: tuple[BrokenSource, ...]
    repairs: tuple[RepairEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class PartitionStats:
    """What the projection applied on one partition."""

    partition: int
    next_offset: int
    records: int
    appended: int
    rewinds: int
    duplicates: int
    quarantined: int


@dataclass(frozen=True, slots=True)
class ProjectionStats:
    """Counts of a projection, read in one snapshot."""

    topic: str | None
    topic_id: str | None
    partitions: tuple[PartitionStats, ...]
    turns: int
    sources: int
    projects: int
    superseded: int
    quarantined: int
    broken_sources: int
    repaired: int = 0  # quarantined records a repair marked
    repairs: int = 0  # repair records applied (any outcome)
    latest_quarantine: tuple[QuarantineEntry, ...] = field(default_factory=tuple)
