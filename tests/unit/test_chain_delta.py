"""``ChainDelta``: a run of appends and rewinds over a stored prefix equals the plain-list fold.

The plain-list fold is what ``ChainBook.apply`` did before the delta (``superseded.extend(turns[seq-1:])``,
``del turns[seq-1:]``, append). The delta must give the same live chain, the same superseded turns at
each rewind (split into stored ranges it records and pending rows it hands back), and the same
``d(k)`` at every step, whatever the stored prefix. The fold and oracle properties check the rest
(``test_fold.py``, ``test_store.py``, ``tests/oracle``).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from throughline.core.chain_delta import ChainDelta

Turn = tuple[int, bytes]  # (seq, its digest)


def _digest(label: int) -> bytes:
    return label.to_bytes(4, "big")


@st.composite
def runs(draw: st.DrawFn) -> tuple[int, list[int]]:
    """A stored length and the seqs of a run of records, each one append or rewind of the chain so far."""
    stored = draw(st.integers(0, 12))
    length = stored
    seqs: list[int] = []
    for _ in range(draw(st.integers(0, 25))):
        seq = draw(st.integers(1, length + 1))
        seqs.append(seq)
        length = seq
    return stored, seqs


@given(runs())
def test_a_delta_over_a_stored_prefix_folds_like_the_plain_list(run: tuple[int, list[int]]) -> None:
    stored_length, seqs = run
    stored: list[Turn] = [(k, _digest(k)) for k in range(1, stored_length + 1)]
    chain = list(stored)  # the plain-list fold
    delta: ChainDelta[Turn] = ChainDelta(stored_length, lambda t: t[1], lambda k: stored[k - 1][1])
    for i, seq in enumerate(seqs):
        label = 1000 + i
        for k in range(1, len(chain) + 1):
            assert delta.digest_at(k) == chain[k - 1][1]
        expected: list[Turn] = []
        if seq <= len(chain):
            expected = chain[seq - 1 :]
            del chain[seq - 1 :]
            cuts_before = len(delta.cuts)
            moved = delta.rewind(seq, 0, i)
            from_store = [t for first, last, _, _ in delta.cuts[cuts_before:] for t in stored[first - 1 : last]]
            assert [cut[2:] for cut in delta.cuts[cuts_before:]] == ([(0, i)] if from_store else [])
            assert from_store + moved == expected
        chain.append((seq, _digest(label)))
        delta.pending.append((seq, _digest(label)))
        assert stored[: delta.cut - 1] + delta.pending == chain
    # Stored turns are superseded at most once: the recorded ranges are disjoint.
    covered = [k for first, last, _, _ in delta.cuts for k in range(first, last + 1)]
    assert len(covered) == len(set(covered))


def test_a_delta_with_nothing_stored_refuses_a_stored_digest() -> None:
    delta: ChainDelta[Turn] = ChainDelta(0, lambda t: t[1])
    delta.pending.append((1, b"a"))
    assert delta.digest_at(1) == b"a"
    with pytest.raises(LookupError):
        ChainDelta(2, lambda t: t[1]).digest_at(1)
