"""Records the projector has fetched but not applied yet: the proof behind a wait scoped to one project.

The spec (docs/spec.md#scoped-wait) lets a reader answer from the projection when it can prove that none of the
records below the end offset read at the call that are not applied yet belong to the project. The
projector knows how far its fetches reach on each partition and which project each fetched record
belongs to; ``InFlight`` keeps that, and ``settled`` decides the proof:

    settled(p, project, below)  <=>  applied(p) >= below
                                     or (covered(p) >= below and no record of ``project``, and no
                                         record whose project is unknown, sits in [applied(p), below))

where ``covered(p)`` is the largest of the applied offset and the end of the fetches since the feed
last started (``start``; without it, only the applied offset). Every offset in ``[applied(p), covered(p))`` was fetched (a feed delivers each partition
contiguously from where it started, which is the applied offset) and is either applied or held here
with its project: so when the condition holds, every record of the project below ``below`` is applied.
A record that did not decode names no project for sure (its key could be anyone's): it counts as every
project's. Offsets that hold no record (transaction markers, aborted records) belong to no project.

Not thread-safe: the projection that holds it guards it with the lock that guards its applied offsets,
so that ``settled`` sees the applied offsets and the records in flight of one instant.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping

#: The project of a fetched record whose project is unknown (it blocks every project's proof).
UNKNOWN: None = None


class InFlight:
    """Per partition: how far the fetches reach, and the offsets of each project's fetched records."""

    def __init__(self) -> None:
        self._covered: dict[int, int] = {}
        self._offsets: dict[int, dict[bytes | None, list[int]]] = {}

    def start(self, offsets: Mapping[int, int]) -> None:
        """The feed (re)starts at ``offsets`` (the applied offsets): nothing is in flight."""
        self._covered = {int(p): int(o) for p, o in offsets.items()}
        self._offsets = {}

    def add(self, partition: int, records: Iterable[tuple[int, bytes | None]], next_offset: int) -> None:
        """The feed fetched ``records`` ((offset, project hash or ``UNKNOWN``), ascending) of
        ``partition``, and its position there is now ``next_offset``."""
        held = self._offsets.setdefault(partition, {})
        for offset, project_hash in records:
            held.setdefault(project_hash, []).append(offset)
        if partition in self._covered:  # without a start, where the fetches began is unknown
            self._covered[partition] = max(self._covered[partition], next_offset)

    def applied(self, partition: int, offset: int) -> None:
        """Records of ``partition`` below ``offset`` are applied: forget them."""
        held = self._offsets.get(partition)
        if not held:
            return
        for project_hash in list(held):
            offsets = held[project_hash]
            if offsets[-1] < offset:
                del held[project_hash]
            elif offsets[0] < offset:
                del offsets[: bisect_left(offsets, offset)]

    def covered(self, partition: int, applied: int) -> int:
        """Up to which offset every record of ``partition`` is known (applied, or held here)."""
        return max(applied, self._covered.get(partition, 0))

    def settled(self, partition: int, project_sha256: bytes, below: int, applied: int) -> bool:
        """Is every record of ``project_sha256`` on ``partition`` below ``below`` applied, given the applied offset?"""
        if applied >= below:
            return True
        if self.covered(partition, applied) < below:
            return False  # records between the fetches' reach and ``below`` are unknown; mutant-anchor: scope-unfetched
        held = self._offsets.get(partition, {})
        for key in (project_sha256, UNKNOWN):  # mutant-anchor: scope-own-records
            offsets = held.get(key)
            if offsets:
                i = bisect_left(offsets, applied)
                if i < len(offsets) and offsets[i] < below:
                    return False
        return True
