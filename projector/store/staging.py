"""The staged fold: a poll folded for readers before its transaction commits it (``DuckProjection.stage``).

``StagedFold`` is ``ApplyTransaction``'s fold, run over the committed projection *plus the layers
above it* (``throughline.core.layers``), and writing nothing: the same loop, the same decisions, so
the ``Layer`` it returns is what the transaction that commits the poll will write. Its lookups read the
layers first and then the file through a cursor of their own, outside any transaction:

- a source's state: the newest layer holding it, else the projection's committed cache, else its row;
- a turn id applied before: where a layer last placed it (its turn keys), else ``turn_ids`` (only for
  the keys that ``StoredTurnKeys``, an in-memory filter over ``turn_ids``, reports maybe stored, once
  it is filled) and, for a key it holds, where the file last placed it (``placements``);
- a stored turn's chain digest (a rewind below the fold's start), its turn id (is a turn id still
  live where it was placed) and its row (the turns an amend keeps): the layers' rows, else ``turns``.

Why a read of the file outside a transaction is safe here: only the projector's own thread stages, and
every batch it writes was staged first, so whatever the writer has not committed yet is in a layer the
fold holds; a key, source or turn no layer holds is not being written, and a layer is dropped only
after its commit (so what it held is then in the file).

A repair record writes while it is folded (it marks stored quarantine rows): a poll holding one is not
staged (``stageable``); the pipeline commits it alone, with nothing staged above it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence

import duckdb

from throughline.core.layers import (
    BELOW,
    Layer,
    SourceLayer,
    layered_row,
    layered_turn_key,
    newest_source,
)
from throughline.projector.exceptions import InvalidBatchError
from throughline.projector.prepare import PreparedBatch, RepairItem, SoundRecord
from throughline.projector.read_state import ReadState
from throughline.projector.store.files import cursor
from throughline.projector.store.placements import Placed, stored_placements
from throughline.projector.store.state import PartitionCounters, SourceState
from throughline.projector.store.stored_keys import StoredTurnKeys
from throughline.projector.store.transaction import ApplyTransaction, stored_turn_ids, wanted_of
from throughline.projector.store.writes import Row


def stageable(batches: Sequence[PreparedBatch]) -> bool:
    """Whether a poll can be staged (it holds no repair record)."""
    return not any(type(it) is RepairItem for b in batches for it in b.items)


class _LayeredSources(Mapping[bytes, SourceState]):
    """Source states as the layers leave them, else as committed (the projection's cache)."""

    def __init__(self, layers: Sequence[Layer], committed: Mapping[bytes, SourceState]) -> None:
        self._layers = layers
        self._committed = committed

    def __getitem__(self, source: bytes) -> SourceState:
        held = newest_source(self._layers, source)
        if held is None:
            return self._committed[source]
        return SourceState(*held.state())

    def __contains__(self, source: object) -> bool:
        return (
            isinstance(source, bytes) and newest_source(self._layers, source) is not None
        ) or source in self._committed

    def __iter__(self) -> Iterator[bytes]:
        seen = {s for layer in self._layers for s in layer.sources}
        yield from seen
        yield from (s for s in self._committed if s not in seen)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class StagedFold(ApplyTransaction):
    """The fold of one poll over the committed projection and ``layers``, as a ``Layer`` (``layer``)."""

    def __init__(
        self,
        cur: duckdb.DuckDBPyConnection,
        topic: str,
        batches: Sequence[PreparedBatch],
        *,
        layers: Sequence[Layer],
        source_cache: Mapping[bytes, SourceState],
        applied: Mapping[int, int],
        stored_keys: StoredTurnKeys | None = None,
    ) -> None:
        """``applied``: each partition's next offset with every layer folded in (records below are skipped);
        ``stored_keys``: which keys ``turn_ids`` may hold (``None``: look every key up)."""
        self._layers = tuple(layers)
        self._stored_keys = stored_keys
        super().__init__(
            cur,
            topic,
            batches,
            source_cache=_LayeredSources(self._layers, source_cache),
            known_heads={},
            counters={p: PartitionCounters(o) for p, o in applied.items()},
        )

    def _probe_turn_ids(self, sound: list[SoundRecord]) -> tuple[set[bytes], dict[bytes, Placed], dict[bytes, bytes]]:
        first: dict[bytes, bytes] = {}
        for it in sound:
            first.setdefault(it.turn_key, it.content_digest)
        existing: dict[bytes, Placed] = {}
        unknown: list[bytes] = []
        for key in first:
            placed = layered_turn_key(self._layers, key)
            if placed is None:
                unknown.append(key)
            else:
                existing[key] = placed
        maybe = self._stored_keys.maybe_stored(unknown) if self._stored_keys is not None else None
        # Only a key turn_ids holds was placed before: where, is looked up for those alone.
        hits = list(stored_turn_ids(self.cur, unknown if maybe is None else maybe))
        if hits:
            found = stored_placements(self.cur, wanted_of(sound, hits))
            if len(found) != len(hits):
                raise InvalidBatchError(
                    "turn_ids holds a turn key whose turn the projection has nowhere (corrupt projection?)"
                )
            existing.update(found)
        return {k for k in first if k not in existing}, existing, first

    def _layered(self, source: bytes, seq: int) -> Row | None:
        """Live turn ``seq`` of ``source`` as a layer holds it, or ``None`` when no layer does (the file's)."""
        row = layered_row(self._layers, source, seq)
        if row is BELOW:
            return None
        if not isinstance(row, tuple):
            raise InvalidBatchError(f"the staged layers lack live turn {seq} of a source (corrupt layers?)")
        return row

    def _stored_digest(self, source: bytes, seq: int) -> bytes:
        row = self._layered(source, seq)
        return super()._stored_digest(source, seq) if row is None else row[6]

    def _stored_completed_at(self, source: bytes, seq: int) -> int:
        row = self._layered(source, seq)
        return super()._stored_completed_at(source, seq) if row is None else int(row[2])

    def _live_below(self, source: bytes, placed: Placed, turn_id: str) -> bool:
        # A layer's placement is in that layer's rows (its cut is at or below it); the file's, unless a
        # layer changed the chain there since.
        row = layered_row(self._layers, source, placed[0])
        if row is BELOW:
            return placed[2]
        return isinstance(row, tuple) and row[1] == turn_id

    def _stored_rows(self, source: bytes, first: int, last: int) -> list[Row]:
        out: list[Row] = []
        for seq in range(first, last + 1):
            row = layered_row(self._layers, source, seq)
            if row is BELOW:
                out.extend(super()._stored_rows(source, seq, seq))
            elif isinstance(row, tuple):
                out.append(row)
            else:
                raise InvalidBatchError(f"the staged layers lack live turn {seq} of a source (corrupt layers?)")
        return out

    def layer(self, number: int) -> Layer:
        """Fold the poll and return what it decided as layer ``number`` (writes nothing)."""
        self.fold()
        sources = {
            source: SourceLayer(
                w.state.project_sha256,
                w.cut,
                tuple(w.pending),
                w.state.length,
                w.state.chain_digest,
                w.state.head_partition,
                w.state.head_offset,
                w.state.broken_reason,
                w.state.broken_partition,
                w.state.broken_offset,
            )
            for source, w in self.works.items()
        }
        layer = Layer(
            number,
            sources,
            dict(self.heads),
            {p: c.next_offset for p, c in self.counters.items()},
            dict(self.applied_now),
        )
        self.release()
        return layer


def agrees(committed: Sequence[Layer], states: Mapping[bytes, SourceState]) -> bool:
    """Whether a commit's source states (``ApplyTransaction.states``) are those its layers staged: the
    same sources, each as the newest of the layers left it (a disagreement is a bug, never data)."""
    held = {s for layer in committed for s in layer.sources}
    if held != set(states):
        return False
    for source, state in states.items():
        layer = newest_source(committed, source)
        assert layer is not None
        if layer.state() != state.values():
            return False
    return True


class Stager:
    """The staging side of one ``DuckProjection``: folds polls into layers (``stage``) and hands them to the
    projection's ``ReadState``, which owns them (and drops them) from then on."""

    def __init__(self, reads: ReadState) -> None:
        self._reads = reads
        self._lock = threading.Lock()
        self._cur: duckdb.DuckDBPyConnection | None = None  # the staged fold's own cursor
        #: The turn keys ``turn_ids`` may hold, in memory (filled once the first poll is staged).
        self.stored_keys = StoredTurnKeys()
        self._numbers = 0
        #: A commit disagreed with its layers: commits only from then on (set under ``reads.cond``).
        self.off = False

    def stage(
        self,
        con: duckdb.DuckDBPyConnection,
        topic: str,
        batches: Sequence[PreparedBatch],
        cache: Mapping[bytes, SourceState],
    ) -> Layer | None:
        """Fold a poll over the committed projection (``cache``: its committed source states) and the layers,
        and publish the result as a layer.

        Reads answer from the layer at once (its records count as applied for ``wait_settled``) until the
        commit of the same records (``apply_prepared``, on any thread) replaces it. Call it from one
        thread, in log order, and commit every staged poll in that order; a poll with a repair record
        cannot be staged (``stageable``: commit it alone). ``None``: nothing to stage (the records were
        staged or applied before, or staging is off).
        """
        if not stageable(batches):
            raise InvalidBatchError("a poll holding a repair record is committed alone, not staged")
        reads = self._reads
        with self._lock:
            with reads.cond:
                if self.off or reads.gap:
                    return None
                snap, epoch = reads.snapshot, reads.epoch
            fold = StagedFold(
                self._prepare(con),
                topic,
                batches,
                layers=snap.layers,
                source_cache=cache,
                applied=snap.readable,
                stored_keys=self.stored_keys,
            )
            if not fold.changes_anything:
                return None
            self._numbers += 1
            layer = fold.layer(self._numbers)
            with reads.cond:
                # Its base was dropped meanwhile (a failed write), or staging was turned off.
                if self.off or not reads.stage(layer, epoch):
                    return None
            return layer

    def prepare(self, con: duckdb.DuckDBPyConnection) -> None:
        """Open the fold's cursor and start filling the stored turn keys (idempotent; ``stage`` does it
        first otherwise), from the thread that stages: the fill (a scan of ``turn_ids`` in Python, 2.3 s a
        million keys) then runs before the first poll to stage, not beside it."""
        with self._lock:
            self._prepare(con)

    def _prepare(self, con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
        if self._cur is None:
            self._cur = cursor(con)
            self.stored_keys.start(con)
        return self._cur

    def close(self) -> None:
        """Close the fold's cursor (after the last ``stage``)."""
        self.stored_keys.close()
        with self._lock:
            if self._cur is not None:
                self._cur.close()
                self._cur = None
