"""Turns folded but not committed yet: the layers a read sees on top of the committed projection (pure).

Inside ``serve`` the projector folds each poll as soon as it arrives and commits it to DuckDB a moment
later, on another thread (``throughline.projector.pipeline``). What a poll's fold decided is published
at once as an immutable ``Layer``: for each source it touched, the chain from the layer's ``cut`` on
(the rows ``cut..length``; rows below ``cut`` are as before the layer), its new head and broken mark;
the projects whose head source it moved; how far it reaches on each partition. A read takes the
committed version and the layers above it in one step (``ReadIndex``), so ``LayeredView`` answers
exactly the state after the last layer: the projection as the log makes it up to that point, only
not written to the file yet. A commit publishes its version and drops its layers in one step.

Why this is honest (docs/spec.md#projection-pending, #freshness): a layer is the fold of records the
log holds (acknowledged appends, read back from the broker), folded by the same code, in the same
order, over the same state as the transaction that commits them (``ApplyTransaction``), so the rows,
digests and cursors a read serves from it are the ones the file will hold. A crash before the commit
loses the layer, never the log: the records are read and folded again, to the same result, and a
cursor served from a layer names a log position the projector has not committed yet, so a read with
it answers ``projection_pending`` until it has (never another chain).

How a layer composes: for a source, the newest layer holding it with ``cut <= seq`` gives turn
``seq`` (absent when past that layer's ``length``); when no layer holding it has ``cut <= seq``, the
turn is the committed one. The newest layer holding a source gives its head and broken mark, and the
newest layer that moved a project's head gives its head source.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from throughline.core.cursor import Cursor
from throughline.core.ports import ProjectionView, SourceInfo, StoredTurn

#: A live turn as a layer holds it, in ``StoredTurn``'s field order: (seq, turn_id, completed_at_us,
#: body, body_bytes, content_digest, chain_digest, partition, offset).
LayerRow = tuple[int, str, int, str, int, bytes, bytes, int, int]


@dataclass(frozen=True, slots=True)
class SourceLayer:
    """One source's chain after a layer: rows ``cut..length`` are the layer's, and its head and health."""

    project_sha256: bytes
    cut: int
    rows: tuple[LayerRow, ...]
    length: int
    chain_digest: bytes
    head_partition: int | None
    head_offset: int | None
    broken_reason: str | None
    broken_partition: int | None
    broken_offset: int | None

    def state(self) -> tuple[bytes, int, bytes, int | None, int | None, str | None, int | None, int | None]:
        """The head and health in the projector's source-state order (project, length, digest, head
        position, broken reason and position)."""
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

    def row(self, seq: int) -> LayerRow | None:
        """Turn ``seq`` (``seq >= cut``) as this layer leaves it, or ``None`` past its length."""
        i = seq - self.cut
        return self.rows[i] if 0 <= i < len(self.rows) else None


@dataclass(frozen=True, slots=True)
class Layer:
    """What one fold decided, above the layers before it (``number`` grows by one a layer)."""

    number: int
    sources: Mapping[bytes, SourceLayer]
    #: project -> head source, for the projects whose head this layer moved.
    heads: Mapping[bytes, bytes]
    #: partition -> the next offset after this layer (every record below it is folded).
    next_offsets: Mapping[int, int]
    #: turn key -> (seq, content digest, True) of its last placement, for every turn this layer appended
    #: or amended (the fold's look-up of a turn id applied before; whether it is still live is read
    #: from the layers' rows at that seq).
    turn_keys: Mapping[bytes, tuple[int, bytes, bool]] = field(default_factory=dict)

    @property
    def projects(self) -> frozenset[bytes]:
        """The projects whose chains this layer changed."""
        return frozenset({*self.heads, *(s.project_sha256 for s in self.sources.values())})


def newest_source(layers: Sequence[Layer], source_sha256: bytes) -> SourceLayer | None:
    """The newest layer's state of the source, or ``None`` when no layer holds it."""
    for layer in reversed(layers):
        held = layer.sources.get(source_sha256)
        if held is not None:
            return held
    return None


class Below:
    """The turn is below every layer's cut: the committed projection holds it."""


BELOW = Below()


def layered_row(layers: Sequence[Layer], source_sha256: bytes, seq: int) -> LayerRow | None | Below:
    """Turn ``seq`` of the source as the layers leave it (``None``: not live), or ``BELOW``."""
    for layer in reversed(layers):
        held = layer.sources.get(source_sha256)
        if held is not None and held.cut <= seq:
            return held.row(seq)
    return BELOW


def layered_turn_key(layers: Sequence[Layer], turn_key: bytes) -> tuple[int, bytes, bool] | None:
    """Where the newest layer that placed ``turn_key`` placed it: (seq, content digest, True), or ``None``."""
    for layer in reversed(layers):
        placed = layer.turn_keys.get(turn_key)
        if placed is not None:
            return placed
    return None


class LayeredView:
    """A ``ProjectionView``: ``inner`` (a committed snapshot) with ``layers`` (the ones above its version)
    on top."""

    def __init__(self, inner: ProjectionView, layers: Sequence[Layer]) -> None:
        self._inner = inner
        self._layers = tuple(layers)

    def applied_offset(self, partition: int) -> int:
        """The next offset to apply on ``partition``: past the newest layer that reaches it."""
        offset = self._inner.applied_offset(partition)
        for layer in self._layers:
            offset = max(offset, layer.next_offsets.get(partition, offset))
        return offset

    def head(self, project_sha256: bytes) -> Cursor | None:
        """The project's head source's full chain as a cursor (layers first), or ``None``."""
        source: bytes | None = None
        for layer in reversed(self._layers):
            source = layer.heads.get(project_sha256)
            if source is not None:
                break
        if source is None:
            committed = self._inner.head(project_sha256)
            if committed is None:
                return None
            source = committed.source_sha256
            held = newest_source(self._layers, source)
            if held is None:
                return committed
        else:
            held = newest_source(self._layers, source)
            if held is None:  # pragma: no cover - a layer that moves a head holds its source
                raise AssertionError("a layer moved a project's head without holding its source")
        if not held.length or held.head_partition is None or held.head_offset is None:
            return None
        return Cursor(project_sha256, source, held.length, held.chain_digest, held.head_partition, held.head_offset)

    def source(self, source_sha256: bytes) -> SourceInfo | None:
        """The source's chain head and broken mark (layers first), or ``None`` when never seen."""
        held = newest_source(self._layers, source_sha256)
        if held is None:
            return self._inner.source(source_sha256)
        return SourceInfo(held.project_sha256, source_sha256, held.length, held.chain_digest, held.broken_reason)

    def turns(self, source_sha256: bytes, first_seq: int, last_seq: int) -> list[StoredTurn]:
        """Live turns ``first_seq..last_seq`` in ascending seq (missing rows are absent)."""
        return self.turns_many([(source_sha256, first_seq, last_seq)])[0]

    def turns_many(self, ranges: Sequence[tuple[bytes, int, int]]) -> list[list[StoredTurn]]:
        """``turns`` of each range: the part below the layers' lowest cut from ``inner`` in one read, the
        rest from the layers."""
        below: list[tuple[bytes, int, int]] = []
        lows: list[int | None] = []
        for source, first, last in ranges:
            cuts = [held.cut for layer in self._layers if (held := layer.sources.get(source)) is not None]
            low = min(cuts) if cuts else None
            lows.append(low)
            below.append((source, first, last if low is None else min(last, low - 1)))
        committed = self._inner.turns_many(below)
        out: list[list[StoredTurn]] = []
        for (source, first, last), low, rows in zip(ranges, lows, committed, strict=True):
            if low is None:
                out.append(rows)
                continue
            served = list(rows)
            for seq in range(max(first, low, 1), last + 1):
                row = layered_row(self._layers, source, seq)
                if isinstance(row, tuple):
                    served.append(StoredTurn(*row))
                elif row is None:
                    break  # past the chain's length: nothing further is live
            out.append(served)
        return out


def layered_offsets(committed: Mapping[int, int], layers: Sequence[Layer]) -> dict[int, int]:
    """The applied offsets with every layer folded in (the largest of each partition's)."""
    out = dict(committed)
    for layer in layers:
        for partition, offset in layer.next_offsets.items():
            out[partition] = max(out.get(partition, 0), offset)
    return out
