"""Properties of the pure fold (``throughline.core.fold``): what the projector applies, record by record."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st
from projector_histories import BODIES, histories, turn

from throughline.core.chain import CHAIN_ORIGIN, chain_digests, content_digest, next_chain_digest
from throughline.core.fold import (
    Amend,
    Append,
    ChainBook,
    ChainHead,
    Duplicate,
    Outcome,
    Placement,
    Reject,
    fold_turn,
    record_problem,
)
from throughline.core.turn import TurnRecord

# ------------------------------------------------------------------ a fold over persisted state only


@dataclass
class SourceChain:
    """What a projector keeps about one source between batches: the live turns (digests, contents, ids)
    and where each id applied was last placed (seq, content)."""

    digests: list[bytes] = field(default_factory=list)
    contents: list[bytes] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    times: list[int] = field(default_factory=list)  # each live turn's completedAt
    applied: dict[str, tuple[int, bytes]] = field(default_factory=dict)


@dataclass
class FoldState:
    """The whole persisted state: chains per source and each project's head source."""

    chains: dict[bytes, SourceChain] = field(default_factory=dict)
    heads: dict[bytes, bytes] = field(default_factory=dict)


def fold_records(state: FoldState, records: list[TurnRecord]) -> list[Outcome]:
    """Fold ``records`` into ``state`` (mutated) using only ``fold_turn`` and ``record_problem``."""
    outcomes: list[Outcome] = []
    for r in records:
        problem = record_problem(r, r.project_sha256)
        if problem is not None:
            outcomes.append(Reject(problem))
            continue
        chain = state.chains.setdefault(r.source_sha256, SourceChain())
        digests = chain.digests
        head = ChainHead(len(digests), digests[-1] if digests else CHAIN_ORIGIN)
        placed = chain.applied.get(r.turn_id)
        placement = None
        if placed is not None:
            p = placed[0]
            placement = Placement(p, placed[1], p <= len(chain.ids) and chain.ids[p - 1] == r.turn_id)
        outcome = fold_turn(
            head,
            r,
            applied=placement,
            digest_at=lambda k, d=digests: d[k - 1],
            completed_at=lambda k, t=chain.times: t[k - 1],
        )
        if isinstance(outcome, Append | Amend):
            seq = outcome.seq
            kept = (
                list(zip(chain.ids[seq:], chain.contents[seq:], chain.times[seq:], strict=True))
                if isinstance(outcome, Amend)
                else []
            )
            for column in (digests, chain.contents, chain.ids, chain.times):
                del column[seq - 1 :]
            digests.append(outcome.chain_digest)
            chain.contents.append(r.content_digest)
            chain.ids.append(r.turn_id)
            chain.times.append(r.completed_at_micros)
            for turn_id, content, at in kept:
                digests.append(next_chain_digest(digests[-1], content))
                chain.contents.append(content)
                chain.ids.append(turn_id)
                chain.times.append(at)
            chain.applied[r.turn_id] = (seq, r.content_digest)
            state.heads[r.project_sha256] = r.source_sha256
        outcomes.append(outcome)
    return outcomes


def snapshot(book: ChainBook) -> ChainBook:
    """A deep copy of a book (its state before an apply)."""
    return copy.deepcopy(book)


# --------------------------------------------------------------------------------------- properties


@given(histories(), st.data())
def test_folding_a_prefix_then_the_rest_equals_folding_everything(
    records: list[TurnRecord], data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(records)))
    whole = FoldState()
    all_outcomes = fold_records(whole, records)

    resumed = FoldState()
    first = fold_records(resumed, records[:cut])
    resumed = copy.deepcopy(resumed)  # only the persisted state crosses the boundary
    rest = fold_records(resumed, records[cut:])

    assert first + rest == all_outcomes
    assert resumed == whole

    # The reference book agrees with the state-only fold (same chains, same heads).
    book = ChainBook()
    book_outcomes = [book.apply(r, 0, i, r.project_sha256) for i, r in enumerate(records)]
    assert book_outcomes == all_outcomes
    assert {s: [t.chain_digest for t in ts] for s, ts in book.live.items() if ts} == {
        s: c.digests for s, c in whole.chains.items() if c.digests
    }
    assert book.heads == whole.heads


@given(histories(), st.data())
def test_a_duplicate_never_changes_the_state(records: list[TurnRecord], data: st.DataObject) -> None:
    # An appended record that is still where its turn id was last placed: sent again, it changes
    # nothing (an earlier placement of a turn id since placed elsewhere moves it back: not drawn here).
    book = ChainBook()
    last: dict[tuple[bytes, str], TurnRecord] = {}
    for i, r in enumerate(records):
        if isinstance(book.apply(r, 0, i, r.project_sha256), Append | Amend):
            last[(r.source_sha256, r.turn_id)] = r
    # Still live where it was placed: a superseded turn re-sent completed after its chain's head is
    # placed again (docs/design.md, "Re-ingesting with a newer parser (implemented)"), not a duplicate.
    live = {(s, t.turn_id): t.record for s, turns in book.live.items() for t in turns}
    appended = [r for r in last.values() if live.get((r.source_sha256, r.turn_id)) == r]
    if not appended:
        return
    again = data.draw(st.sampled_from(appended))
    before = snapshot(book)
    outcome = book.apply(again, 0, len(records), again.project_sha256)
    assert outcome == Duplicate()
    assert book == before


@given(histories())
def test_chain_digests_match_the_digest_module(records: list[TurnRecord]) -> None:
    book = ChainBook()
    for i, r in enumerate(records):
        book.apply(r, 0, i, r.project_sha256)
    for turns in book.live.values():
        assert [t.seq for t in turns] == list(range(1, len(turns) + 1))
        contents = [content_digest(t.turn_id, t.record.completed_at_micros, t.record.body) for t in turns]
        assert contents == [t.content_digest for t in turns]
        assert chain_digests(contents) == [t.chain_digest for t in turns]


@given(histories(), st.data())
def test_a_rewind_supersedes_exactly_the_turns_after_seq_minus_one(
    records: list[TurnRecord], data: st.DataObject
) -> None:
    book = ChainBook()
    for i, r in enumerate(records):
        book.apply(r, 0, i, r.project_sha256)
    chains = sorted((s, ts) for s, ts in book.live.items() if ts)
    if not chains:
        records = [turn(turn_id="seed")]
        book.apply(records[0], 0, 0, records[0].project_sha256)
        chains = sorted((s, ts) for s, ts in book.live.items() if ts)
    _, old_turns = data.draw(st.sampled_from(chains))
    old = list(old_turns)
    first = old[0].record
    project, host, thread = first.project, first.host, first.thread
    k = data.draw(st.integers(1, len(old)))
    rewind = turn(project, host, thread, "rewinder", seq=k, body=data.draw(st.sampled_from(BODIES)))
    superseded_before = list(book.superseded)
    heads_before = dict(book.heads)

    outcome = book.apply(rewind, 0, len(records), rewind.project_sha256)

    assert outcome == Append(k, book.live[rewind.source_sha256][-1].chain_digest, len(old))
    assert outcome.is_rewind
    live = book.live[rewind.source_sha256]
    assert live[: k - 1] == old[: k - 1]
    assert [t.turn_id for t in live] == [t.turn_id for t in old[: k - 1]] + ["rewinder"]
    assert book.superseded == superseded_before + old[k - 1 :]
    base = old[k - 2].chain_digest if k > 1 else CHAIN_ORIGIN
    assert chain_digests([rewind.content_digest], base) == [live[-1].chain_digest]
    assert book.heads == {**heads_before, rewind.project_sha256: rewind.source_sha256}


@given(histories())
def test_the_head_source_is_the_source_of_the_latest_append(records: list[TurnRecord]) -> None:
    book = ChainBook()
    expected: dict[bytes, bytes] = {}
    for i, r in enumerate(records):
        heads_before = dict(book.heads)
        outcome = book.apply(r, 0, i, r.project_sha256)
        if isinstance(outcome, Append | Amend):  # an amend changed the chain too
            expected[r.project_sha256] = r.source_sha256
        else:
            assert book.heads == heads_before  # a duplicate or a rejected record never switches the head
        assert book.heads == expected


# --------------------------------------------------------------------------------------- examples


def test_append_without_seq_and_with_the_next_seq() -> None:
    a, b = turn(turn_id="a"), turn(turn_id="b", seq=2)
    head = ChainHead()
    first = fold_turn(head, a, applied=None, digest_at=lambda k: b"", completed_at=lambda k: 0)
    assert first == Append(1, chain_digests([a.content_digest])[0], None)
    assert isinstance(first, Append)
    second = fold_turn(
        ChainHead(1, first.chain_digest), b, applied=None, digest_at=lambda k: b"", completed_at=lambda k: 0
    )
    assert second == Append(2, chain_digests([a.content_digest, b.content_digest])[1], None)


def test_a_gap_is_rejected_and_breaks_the_source() -> None:
    book = ChainBook()
    book.apply(turn(turn_id="a"), 0, 0)
    outcome = book.apply(turn(turn_id="c", seq=3), 0, 1)
    assert isinstance(outcome, Reject) and "gap" in outcome.reason
    source = turn().source_sha256
    assert source in book.broken
    assert [t.turn_id for t in book.live[source]] == ["a"]
    assert book.quarantined == [(0, 1, outcome.reason)]


def test_a_turn_id_reused_with_other_content_amends_the_turn() -> None:
    book = ChainBook()
    book.apply(turn(turn_id="a", body="one"), 0, 0)
    book.apply(turn(turn_id="b", body="next"), 0, 1)
    amended = turn(turn_id="a", body="two")
    outcome = book.apply(amended, 0, 2)
    assert isinstance(outcome, Amend) and outcome.seq == 1 and outcome.rewound_from == 2
    turns = book.live[turn().source_sha256]
    assert [(t.turn_id, t.record.body) for t in turns] == [("a", "two"), ("b", "next")]
    assert [t.chain_digest for t in turns] == chain_digests([amended.content_digest, turns[1].content_digest])
    assert not book.quarantined and not book.broken


def test_a_superseded_turn_id_is_still_a_duplicate() -> None:
    book = ChainBook()
    for i, tid in enumerate(["a", "b", "c"]):
        book.apply(turn(turn_id=tid), 0, i)
    assert isinstance(book.apply(turn(turn_id="x", seq=2), 0, 3), Append)
    assert book.apply(turn(turn_id="b"), 0, 4) == Duplicate()
    assert [t.turn_id for t in book.live[turn().source_sha256]] == ["a", "x"]


def test_unsound_records_are_rejected_before_the_chain() -> None:
    good = turn()
    tampered = TurnRecord(**{**_fields(good), "body": "tampered"})
    assert record_problem(tampered, good.project_sha256) == "contentDigest does not match the turn's content"
    other_key = turn(project="/elsewhere").project_sha256
    assert record_problem(good, other_key) == "record's project does not match its partition key"
    assert record_problem(good, None) is None
    book = ChainBook()
    assert isinstance(book.apply(tampered, 0, 0), Reject)
    assert book.broken == set() and book.live == {}


def _fields(record: TurnRecord) -> dict[str, object]:
    return {name: getattr(record, name) for name in record.__dataclass_fields__}


@settings(max_examples=30)
@given(st.integers(1, 6), st.integers(0, 5))
def test_a_host_switch_moves_the_head_and_keeps_both_chains(n_first: int, n_second: int) -> None:
    book = ChainBook()
    offset = 0
    for i in range(n_first):
        book.apply(turn(host="host-a", turn_id=f"a{i}"), 0, offset)
        offset += 1
    for i in range(n_second):
        book.apply(turn(host="host-b", turn_id=f"b{i}"), 0, offset)
        offset += 1
    a, b = turn(host="host-a"), turn(host="host-b")
    assert book.heads[a.project_sha256] == (b.source_sha256 if n_second else a.source_sha256)
    assert len(book.live[a.source_sha256]) == n_first
    assert len(book.live.get(b.source_sha256, [])) == n_second
