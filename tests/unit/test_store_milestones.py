"""A source's ``sources`` row is written at its milestones only (``view.is_milestone``), and every reader
takes the head past it from the turns (``view.heads_past_milestones``).

Most appends leave the row as it is, so a long chain's row lags its head by up to 63 turns; these tests
use chains far longer than the generated histories of test_store.py (which rarely reach a bucket's end),
with rewinds and gaps across bucket boundaries, and read them back through every path that starts from
a row: a view with a cold read index, the writer with a cold source cache (a reopened file, a cache of
one source), the quarantine listing of broken sources, and replay in other batch boundaries.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from projector_histories import PROJECTS, TOPIC, apply_whole, book_of, place, to_log, turn
from test_store import assert_matches_book, rows

from throughline.core.chain import CHAIN_ORIGIN
from throughline.core.identity import project_sha256
from throughline.core.turn import TurnRecord
from throughline.projector.store import DuckProjection
from throughline.projector.store.view import PAGE_BUCKET_BITS, is_milestone

BUCKET = 1 << PAGE_BUCKET_BITS


@st.composite
def long_chains(draw: st.DrawFn) -> list[TurnRecord]:
    """Two threads of one project, up to ~300 records: appends, rewinds (often across a bucket's end)
    and an occasional gap (which marks the source broken while its chain goes on)."""
    lengths = {"main": 0, "side": 0}
    out: list[TurnRecord] = []
    for i in range(draw(st.integers(BUCKET, 5 * BUCKET))):
        thread = draw(st.sampled_from(["main", "main", "main", "side"]))
        n = lengths[thread]
        kind = draw(st.integers(0, 39))
        seq: int | None = None
        if kind == 0 and n > 1:
            seq = draw(st.integers(max(1, n - BUCKET - 3), n))  # a rewind, up to a bucket back
        elif kind == 1:
            seq = n + 3  # a gap: refused, the source is broken from here on
        out.append(turn(thread=thread, turn_id=f"{thread}-{i}", seq=seq))
        if seq is None:
            lengths[thread] = n + 1
        elif seq <= n:
            lengths[thread] = seq
    return out


def _reopened_heads(path: Path) -> dict[bytes, tuple[int, bytes]]:
    """Every source's (length, chain digest) as a fresh handle on ``path`` reads it (a cold index)."""
    with DuckProjection.open(path, topic=TOPIC, read_only=True) as cold, cold.view() as v:
        out: dict[bytes, tuple[int, bytes]] = {}
        for r in cold.table_rows("sources"):
            source = bytes(r["source_sha256"])
            info = v.source(source)
            assert info is not None
            out[source] = (info.length, info.chain_digest)
        return out


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(long_chains(), st.data())
def test_long_chains_fold_like_the_book_through_cold_caches_and_any_batching(
    records: list, data: st.DataObject
) -> None:
    placed = place(records, 1)
    log = to_log(placed)
    book = book_of(placed)
    with tempfile.TemporaryDirectory() as tmp:
        whole, cut = Path(tmp) / "whole.duckdb", Path(tmp) / "cut.duckdb"
        with DuckProjection.open(whole, topic=TOPIC) as one:
            apply_whole(one, log)
            digests = one.table_digests()
        # The same log in random batches, a cache of one source and a reopened file half way: every
        # batch of the second handle starts from rows, never from a cached head.
        half = data.draw(st.integers(0, len(log)))
        for part in (log[:half], log[half:]):
            with DuckProjection.open(cut, topic=TOPIC, source_cache=1) as p:
                i = 0
                while i < len(part):
                    size = data.draw(st.integers(1, 2 * BUCKET))
                    p.apply_batch(TOPIC, 0, part[i : i + size])
                    i += size
        with DuckProjection.open(cut, topic=TOPIC) as p:
            assert p.table_digests() == digests
            assert_matches_book(p, book, {0: len(log)})
        assert _reopened_heads(cut) == {
            s: (ts[-1].seq, ts[-1].chain_digest) if ts else (0, CHAIN_ORIGIN) for s, ts in book.live.items()
        }


def test_the_row_holds_the_last_milestone_and_reads_take_the_head_past_it(tmp_path: Path) -> None:
    n = 3 * BUCKET - 7
    log = to_log(place([turn(turn_id=f"t{i}") for i in range(n)]))
    path = tmp_path / "p.duckdb"
    with DuckProjection.open(path, topic=TOPIC) as p:
        for record in log:  # one record a transaction: the writer's usual case under steady ingest
            p.apply_batch(TOPIC, 0, [record])
        ((length,),) = rows(p, "sources", "length")
        assert length == 2 * BUCKET and is_milestone(length)  # the last seq that opened a bucket
        with p.view() as v:
            head = v.head(project_sha256(PROJECTS[0]))
            assert head is not None and head.length == n
    (reopened,) = _reopened_heads(path).values()
    assert reopened[0] == n
    # A writer with a cold cache goes on from the true head (a chain break would quarantine this).
    more = to_log(place([turn(turn_id=f"t{i}") for i in range(n + 1)]))[n:]
    with DuckProjection.open(path, topic=TOPIC, source_cache=1) as p:
        p.apply_batch(TOPIC, 0, more)
        assert p.stats().quarantined == 0
        with p.view() as v:
            (source,) = (bytes(r["source_sha256"]) for r in p.table_rows("sources"))
            info = v.source(source)
            assert info is not None and info.length == n + 1


def test_a_broken_source_lists_its_head_length_not_its_rows(tmp_path: Path) -> None:
    records = [turn(turn_id=f"t{i}") for i in range(5)]
    records.append(turn(turn_id="gap", seq=9))  # refused: broken at length 5
    records += [turn(turn_id=f"u{i}") for i in range(BUCKET)]  # the chain goes on past a bucket's end
    log = to_log(place(records))
    with DuckProjection.open(tmp_path / "p.duckdb", topic=TOPIC) as p:
        for record in log:
            p.apply_batch(TOPIC, 0, [record])
        (broken,) = p.quarantine().broken
        assert broken.length == 5 + BUCKET
        ((stored,),) = rows(p, "sources", "length")
        assert stored == BUCKET  # its last milestone, not its head
