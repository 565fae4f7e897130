"""What a run of appends does to one chain: the one rewind of the fold (pure; no Kafka, no DuckDB).

A chain's live turns ``1..length`` split at ``cut``: turns ``1..cut-1`` are *stored* (somewhere the
delta does not hold: the DuckDB tables, read back through ``stored_digest``) and turns ``cut..length``
are ``pending`` rows the delta holds. An append adds a pending row; a rewind to ``seq`` (``fold_turn``'s
``Append`` with ``rewound_from``) supersedes turns ``seq..length``: the pending ones are handed back to
the caller, the stored ones are recorded in ``cuts`` as (first seq, last seq, partition, offset of the
superseding record) for the caller to move, and ``cut`` drops to ``seq``.

Both folds use it: ``ChainBook.apply`` holds a whole chain as pending rows (``cut == 1``, nothing is
stored beneath it), and the DuckDB batch (``throughline.projector.store.transaction``) starts each
source's delta at its committed head and then writes exactly what the delta says: ``cuts`` become
moves into ``superseded_turns``, the handed-back rows are inserted there, and ``pending`` becomes the
new live rows.

An amend of turn ``seq`` (``fold_turn``'s ``Amend``: its turn id re-sent with other content) is a
rewind to ``seq`` whose superseded turns after ``seq`` come back: ``amend`` also returns them (the
stored ones read through ``stored_rows``), for the caller to append again after the amended turn,
chained anew (``throughline.core.fold.rechain``).

The common path (an append that rewinds nothing) is the caller's ``delta.pending.append(row)``: the
projector folds every record it reads, so that path stays one list append.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

R = TypeVar("R")

#: A stored range a rewind superseded: (first seq, last seq, partition, offset of the superseding record).
Cut = tuple[int, int, int, int]


def _nothing_stored(seq: int) -> bytes:
    raise LookupError(f"turn {seq} is below the delta's cut, and nothing is stored beneath this chain")


def _no_rows_stored(first: int, last: int) -> list[object]:
    raise LookupError(f"turns {first}..{last} are below the delta's cut, and nothing is stored beneath this chain")


class ChainDelta(Generic[R]):
    """One chain's change over a stored prefix: ``pending`` rows from ``cut`` on, and the stored ranges
    rewinds ``cuts``.

    ``length`` is the stored chain's length when the delta starts (``cut = length + 1``);
    ``row_digest(row)`` returns the chain digest of a pending row, ``stored_digest(seq)`` ``d(seq)`` of a
    stored turn (by default there is none); ``pending``, when given, is the list the delta holds (and changes in place).
    """

    __slots__ = ("cut", "cuts", "pending", "row_digest", "stored_digest")

    def __init__(
        self,
        length: int,
        row_digest: Callable[[R], bytes],
        stored_digest: Callable[[int], bytes] = _nothing_stored,
        pending: list[R] | None = None,
    ) -> None:
        self.cut = length + 1
        self.pending: list[R] = [] if pending is None else pending
        self.cuts: list[Cut] = []
        self.stored_digest = stored_digest
        self.row_digest = row_digest

    def digest_at(self, seq: int) -> bytes:
        """``d(seq)`` of the live chain, for ``1 <= seq <= length`` (``fold_turn``'s ``digest_at``)."""
        if seq >= self.cut:
            return self.row_digest(self.pending[seq - self.cut])
        return self.stored_digest(seq)

    def rewind(self, seq: int, partition: int, offset: int) -> list[R]:
        """Supersede live turns ``seq..length`` for the record at (``partition``, ``offset``), which
        becomes turn ``seq`` (the caller appends its row next): return the pending rows it superseded,
        in seq order, and record the stored ones in ``cuts``."""
        if seq < self.cut:
            self.cuts.append((seq, self.cut - 1, partition, offset))
            self.cut = seq
            start = 0
        else:
            start = seq - self.cut
        moved = self.pending[start:]
        del self.pending[start:]
        return moved

    def amend(
        self,
        seq: int,
        partition: int,
        offset: int,
        stored_rows: Callable[[int, int], list[R]] = _no_rows_stored,  # type: ignore[assignment]
    ) -> tuple[list[R], list[R]]:
        """Supersede live turns ``seq..length`` for the record at (``partition``, ``offset``), which
        replaces turn ``seq`` (the caller appends its row next): return the pending rows it superseded
        and the rows of turns ``seq + 1..length``, which stay (the caller appends them again after the
        amended turn, chained anew); ``stored_rows(first, last)`` reads the stored ones, in seq order."""
        kept: list[R] = stored_rows(seq + 1, self.cut - 1) if seq + 1 < self.cut else []
        was_pending = seq >= self.cut
        moved = self.rewind(seq, partition, offset)
        kept.extend(moved[1:] if was_pending else moved)
        return moved, kept
