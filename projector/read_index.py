"""What every read needs, kept in memory: the applied offsets, projects' head sources, chains' heads,
and the layers staged above the committed version (``throughline.core.layers``). A projection's index is
owned by its ``ReadState`` (``throughline.projector.read_state``), which changes it only under its one
condition (the index locks that same condition) and publishes it in each ``ReadSnapshot``.

A first page needs the partition's applied offset, the project's head source and that source's chain
head (length, digest, log position, broken mark) before it reads the turns it serves. Read from DuckDB
they were four point queries besides the one range read of the page, most of a read's cost. The
projection keeps them here instead: the writer publishes what each commit changed, and a read that
misses (an entry never read, or evicted) loads it from its own snapshot and keeps it.

Versions. Every commit moves at least one partition's applied offset forward (a batch that changes
nothing is not written), so the sum of the applied offsets counts commits: it is the *version* of the
projection, in memory (``ReadIndex.version``) and in the database
(``SELECT sum(next_offset) FROM applied_offsets``). Each entry remembers the version it was written at.

Why a view at version ``n`` may answer from an entry: the view reads the database in a transaction
whose snapshot has version ``n`` too (``DuckProjection.view`` checks it, and reads everything from the
database when it cannot get them equal). The writer publishes a commit's entries, and the new version,
in one critical section after the commit; so an entry written at ``w <= n`` that is still the current
one was not changed by any commit after ``w``, in particular by none up to ``n``: it is the state at
``n``. An entry written after ``n`` is not used (the view reads that key from its snapshot). A missing
key is read from the snapshot and learnt only while the index is still at ``n`` (under the lock), so a
later commit that changes it always overwrites it. Dropping an entry is always safe.

Layers. ``stage`` adds a layer the projector folded and has not committed; ``publish`` drops, in the
same critical section as it moves the version, every layer the commit covers (each partition it
reaches is applied that far), so a read's ``ReadSnapshot`` holds exactly the layers above its version.
A snapshot view takes DuckDB's snapshot under the read state's condition: nothing is staged, dropped or
published meanwhile (``snapshots._snapshot``).

Quiet reads (``DuckProjection.read``). The writer announces each write just before its COMMIT
(``writing``) and ends the announcement when it publishes (or, after a failure, once it has checked
that the file is still at the index's version: ``settle``). Each announcement and each end moves a
*generation* forward, odd while a commit is under way. A read whose ``ReadSnapshot`` has an even
generation (``quiet``) and finds the published generation unchanged after a statement knows that no COMMIT ran during that statement, and that every
earlier COMMIT was published before it: the statement read exactly the index's version. Such a read
needs no transaction and no version statement; when the generation moved, its caller reads again in a
snapshot (``DuckProjection.view``). The announcement waits for the COMMIT because a transaction's
writes are invisible to every other cursor until then: a statement that runs beside the rest of the
transaction reads the index's version all the same. (Announced at BEGIN, a projector in a transaction
80-88% of the time under steady ingest sent almost every read to the snapshot: BEGIN, the version,
the page, ROLLBACK, four statements for one.)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from throughline.core.layers import Layer

DEFAULT_READ_ENTRIES = 100_000  # per map (heads, chains): ~200 bytes each


@dataclass(frozen=True, slots=True)
class ChainHead:
    """A source's chain head as committed: what validates a cursor and makes the project's head cursor."""

    project_sha256: bytes
    length: int
    chain_digest: bytes
    head_partition: int | None
    head_offset: int | None
    broken_reason: str | None


class Missing:
    """The index does not know (the caller reads its snapshot)."""


MISSING: Final = Missing()

V = TypeVar("V")


class _Entries(Generic[V]):
    """A bounded map of key -> (version written, value), least recently used evicted first (no locking)."""

    def __init__(self, capacity: int) -> None:
        self._capacity = max(1, capacity)
        self._entries: OrderedDict[bytes, tuple[int, V]] = OrderedDict()

    def get(self, key: bytes, at: int) -> V | Missing:
        entry = self._entries.get(key)
        if entry is None or entry[0] > at:
            return MISSING
        self._entries.move_to_end(key)
        return entry[1]

    def put(self, key: bytes, version: int, value: V) -> None:
        self._entries[key] = (version, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


class ReadIndex:
    """Applied offsets, head sources and chain heads at the projection's current version (thread-safe)."""

    def __init__(
        self,
        applied: Mapping[int, int],
        *,
        capacity: int = DEFAULT_READ_ENTRIES,
        lock: AbstractContextManager[Any] | None = None,
    ) -> None:
        """``lock``: the lock of the read state that owns the index (``ReadState.cond``), else its own."""
        self._lock: AbstractContextManager[Any] = lock if lock is not None else threading.Lock()
        self._applied = dict(applied)
        self._version = sum(self._applied.values())
        self._heads: _Entries[bytes | None] = _Entries(capacity)
        self._chains: _Entries[ChainHead | None] = _Entries(capacity)
        self._generation = 0  # odd while a write is under way (see "Quiet reads" above)
        self._doubt = False  # a failed write left the file at an unknown version: no quiet reads
        self._layers: tuple[Layer, ...] = ()  # folded above the version, not committed yet (oldest first)

    def state(self) -> tuple[int, int, dict[int, int], tuple[Layer, ...], bool]:
        """``(generation, version, applied offsets, layers, doubt)``: everything ``ReadState`` publishes."""
        with self._lock:
            return self._generation, self._version, dict(self._applied), self._layers, self._doubt

    def writing(self) -> None:
        """A write is about to COMMIT: no quiet read holds from now until it is published."""
        with self._lock:
            if self._generation % 2 == 0:
                self._generation += 1

    def settle(self, file_version: int) -> None:
        """End a write that failed: the file's version (read after it) says whether quiet reads still hold."""
        with self._lock:
            self._doubt = self._doubt or file_version != self._version
            if self._generation % 2:
                self._generation += 1

    def stage(self, layer: Layer) -> None:
        """A fold not committed yet: reads see ``layer`` on top of the version (and of earlier layers)."""
        with self._lock:
            self._layers = (*self._layers, layer)

    def unstage(self) -> tuple[Layer, ...]:
        """Drop every layer (their writes failed, or will be folded again); return them."""
        with self._lock:
            dropped, self._layers = self._layers, ()
            return dropped

    def publish(
        self, applied: Mapping[int, int], heads: Mapping[bytes, bytes], chains: Mapping[bytes, ChainHead]
    ) -> tuple[Layer, ...]:
        """A commit: the new applied offsets, and every project head and chain head it wrote. The layers it
        committed (each partition they reach is applied that far) are dropped in the same step and returned."""
        with self._lock:
            self._applied.update(applied)
            self._version = sum(self._applied.values())
            done = 0
            for layer in self._layers:
                if any(self._applied.get(p, 0) < o for p, o in layer.next_offsets.items()):
                    break
                done += 1
            committed, self._layers = self._layers[:done], self._layers[done:]
            for project, source in heads.items():
                self._heads.put(project, self._version, source)
            for source, chain in chains.items():
                self._chains.put(source, self._version, chain)
            if self._generation % 2:
                self._generation += 1
            return committed

    def forget(self) -> None:
        """Drop every entry (after a failed write, whose effect on them is unknown)."""
        with self._lock:
            self._heads.clear()
            self._chains.clear()

    def head(self, project_sha256: bytes, at: int) -> bytes | None | Missing:
        """The project's head source at version ``at`` (``None``: no turns), or ``MISSING``."""
        with self._lock:
            return self._heads.get(project_sha256, at)

    def chain(self, source_sha256: bytes, at: int) -> ChainHead | None | Missing:
        """The source's chain head at version ``at`` (``None``: never seen), or ``MISSING``."""
        with self._lock:
            return self._chains.get(source_sha256, at)

    def learn_head(self, project_sha256: bytes, source: bytes | None, at: int) -> None:
        """Keep a head read from a snapshot of version ``at`` (only while the index is still at ``at``)."""
        with self._lock:
            if self._version == at:
                self._heads.put(project_sha256, at, source)

    def learn_chain(self, source_sha256: bytes, chain: ChainHead | None, at: int) -> None:
        """Keep a chain head read from a snapshot of version ``at`` (only while the index is still at ``at``)."""
        with self._lock:
            if self._version == at:
                self._chains.put(source_sha256, at, chain)
