"""How far an export or an import is, per partition (what their progress callbacks get)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PartitionProgress:
    """How far one partition is: ``position`` runs from ``start`` to ``end`` (offsets for an export,
    records of the backup for an import); ``records``: records written by this run."""

    partition: int
    start: int
    position: int
    end: int
    records: int

    @property
    def done(self) -> bool:
        """The partition reached its end."""
        return self.position >= self.end


@dataclass(frozen=True, slots=True)
class CopyProgress:
    """Every chosen partition's progress, and the seconds since the run began."""

    partitions: tuple[PartitionProgress, ...]
    elapsed: float

    @property
    def fraction(self) -> float:
        """The share of the run's work done (1.0 when there was none)."""
        total = sum(p.end - p.start for p in self.partitions)
        done = sum(min(p.position, p.end) - p.start for p in self.partitions)
        return done / total if total > 0 else 1.0
