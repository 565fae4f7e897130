"""Re-ingesting a history with a newer parser: the fold corrects the chain, never quarantines.

Part 1 checks what ``ChainBook`` (the pure fold every projection shares; the projection contract tests
hold the DuckDB adapters to it) does when a history is sent again by a parser that numbers or renders
some turns differently: an extra turn, a turn once sent with a partial reply, a turn the old parser
made up. The same-parser cases (an exact re-send, a stale re-send across a host rewind, two producers
interleaved) change nothing.

Part 2 is the rule (docs/design.md, "Re-ingesting with a newer parser") as a model of plain lists,
``Proposed``, checked by Hypothesis properties: for any host history (a tree of prompts, rewinds
included) and any "old parser" that dropped turns, cut replies or made turns up on the thread's final
chain, folding the old parser's records and then the new parser's ends with exactly the new parser's
chain and rejects nothing; the records of one parser sent twice, interleaved in any way or re-sent from any
line, end with that parser's chain. The model is the oracle of the production fold: ``ChainBook``
agrees with it on every such history, and on the generated histories of the projection tests. The
histories' ``completedAt`` increase along the host's turns, which the rule assumes (a superseded turn
re-sent completed after the chain's head is placed again). Its known limits (a turn the old parser
missed on a branch the host later left; a host clock that stepped back across a rewind) are pinned last.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st
from projector_histories import turn

from throughline.core.fold import ChainBook

# --------------------------------------------------------------------------- part 1: the fold today

Spec = tuple[str, int | None, str, int]  # (turn id, seq, body, completedAt)


def book(*batches: list[Spec]) -> ChainBook:
    b = ChainBook()
    offset = 0
    for batch in batches:
        for turn_id, seq, body, at in batch:
            b.apply(turn(turn_id=turn_id, seq=seq, body=body, at=1_700_000_000_000_000 + at), 0, offset)
            offset += 1
    return b


def live(b: ChainBook) -> list[Spec]:
    (chain,) = b.live.values() or [[]]
    return [(t.turn_id, t.seq, t.record.body, t.record.completed_at_micros - 1_700_000_000_000_000) for t in chain]


OLD = [("t1", 1, "one", 10), ("t2", 2, "two", 20), ("t3", 3, "three", 30)]


def test_an_exact_resend_is_applied_once() -> None:
    b = book(OLD, OLD)
    assert live(b) == [("t1", 1, "one", 10), ("t2", 2, "two", 20), ("t3", 3, "three", 30)] and not b.quarantined


def test_an_extra_turn_shifts_the_rest_and_the_next_turn_appends() -> None:
    new = [("t1", 1, "one", 10), ("x", 2, "interrupted", 15), ("t2", 3, "two", 20), ("t3", 4, "three", 30)]
    b = book(OLD, new)
    # x rewinds the thread to 2; t2 and t3, superseded since, come back at their new seqs
    assert live(b) == new and not b.quarantined
    b.apply(turn(turn_id="t4", seq=5, body="four", at=1_700_000_000_000_040), 0, 99)  # numbered by the new parser
    assert live(b) == [*new, ("t4", 5, "four", 40)] and not b.quarantined and not b.broken


def test_a_full_reply_for_a_turn_sent_partial_amends_it_and_keeps_the_turns_after_it() -> None:
    new = [("t1", 1, "one", 10), ("t2", 2, "two, the whole reply", 20), ("t3", 3, "three", 30)]
    before = book(OLD)
    old_digests = [t.chain_digest for t in before.live[next(iter(before.live))]]
    b = book(OLD, new[1:2])  # the amended turn alone: t3 stays, chained anew
    assert live(b) == new and not b.quarantined and not b.broken
    (chain,) = b.live.values()
    assert chain[0].chain_digest == old_digests[0]
    assert [t.chain_digest for t in chain[1:]] != old_digests[1:]
    # both old rows (the partial t2 and t3 as chained before) are superseded, for audit
    assert [(t.turn_id, t.chain_digest) for t in b.superseded] == [("t2", old_digests[1]), ("t3", old_digests[2])]
    assert live(book(OLD, new)) == new


def test_a_turn_the_new_parser_drops_goes_and_the_rest_moves_up() -> None:
    old = [("t1", 1, "one", 10), ("bogus", 2, "made up", 15), ("t2", 3, "two", 20), ("t3", 4, "three", 30)]
    new = [("t1", 1, "one", 10), ("t2", 2, "two", 20), ("t3", 3, "three", 30), ("t4", 4, "four", 40)]
    b = book(old, new)
    assert live(b) == new and not b.quarantined


def test_a_later_seq_for_a_live_turn_is_a_duplicate() -> None:
    # a turn before it was not sent yet (a follower behind): it stays where it is
    b = book(OLD, [("t2", 5, "two", 20)])
    assert live(b) == OLD and not b.quarantined


def test_a_stale_resend_across_a_host_rewind_changes_nothing() -> None:
    history = [*OLD, ("t4", 2, "after the rewind", 40)]
    b = book(history, history)
    assert live(b) == [("t1", 1, "one", 10), ("t4", 2, "after the rewind", 40)] and not b.quarantined
    # a hook and a follower, the follower a turn behind: its t3 lands after the rewind
    b = book(history, [("t3", 3, "three", 30), ("t4", 2, "after the rewind", 40)])
    assert live(b) == [("t1", 1, "one", 10), ("t4", 2, "after the rewind", 40)] and not b.quarantined
    # even with other content (a newer parser re-sending the abandoned branch): not served, not refused
    b = book(history, [("t3", 3, "three, the whole reply", 30)])
    assert live(b) == [("t1", 1, "one", 10), ("t4", 2, "after the rewind", 40)] and not b.quarantined


def test_a_follower_restarted_with_the_new_parser_and_a_stale_state_still_leaves_a_gap() -> None:
    # What the producer's parser version prevents (it sends such a file again from line 1): the state
    # skips the turns already sent, and the next turn is numbered after an extra turn found earlier.
    b = book(OLD, [("t4", 5, "four", 40)])
    assert [r for _, _, r in b.quarantined] == ["seq 5 leaves a gap after length 3"] and b.broken


# ------------------------------------------------------------- part 2: the proposed rule, as a model


@dataclass
class Applied:
    content: str
    seq: int  # where it was last placed (amending it in place keeps it there)
    live: bool = True


@dataclass
class Proposed:
    """The proposed fold on plain lists: one source, turns as (id, content)."""

    chain: list[tuple[str, str]] = field(default_factory=list)
    times: list[int] = field(default_factory=list)  # each live turn's completedAt
    applied: dict[str, Applied] = field(default_factory=dict)
    rejected: list[tuple[str, int | None]] = field(default_factory=list)

    def _place(self, turn_id: str, seq: int, content: str, at: int) -> str:
        if seq > len(self.chain) + 1:
            self.rejected.append((turn_id, seq))
            return "reject"
        for gone, _ in self.chain[seq - 1 :]:
            self.applied[gone].live = False
        del self.chain[seq - 1 :], self.times[seq - 1 :]
        self.chain.append((turn_id, content))
        self.times.append(at)
        self.applied[turn_id] = Applied(content, seq)
        return "append"

    def apply(self, turn_id: str, seq: int | None, content: str, at: int = 0) -> str:
        before = self.applied.get(turn_id)
        if before is None:  # a turn id never applied: as today
            return self._place(turn_id, len(self.chain) + 1 if seq is None else seq, content, at)
        if before.live:
            if seq is not None and seq < before.seq:
                return self._place(turn_id, seq, content, at)  # moved up: a turn before it is gone
            if content == before.content:
                return "duplicate"  # a later seq too: it stays where it is (a turn before it was not sent)
            # Amended (a fuller reply, an outcome): replaced where it stands, the turns after it kept.
            self.chain[before.seq - 1] = (turn_id, content)
            self.times[before.seq - 1] = at
            before.content = content
            return "amend"
        if seq is None or seq == before.seq:
            if seq is not None and (not self.times or at > self.times[-1]):
                # Completed after the chain's head: the turns that superseded it came before it on the
                # host (a newer parser found them), so it is placed again, as a new turn would be.
                return self._place(turn_id, seq, content, at)
            return "duplicate"  # superseded since (a host rewind): a stale re-send changes nothing
        return self._place(turn_id, seq, content, at)  # moved (a turn before it was found): where it is now


def oracle(*batches: list[Spec]) -> Proposed:
    """The model over the records' whole content (body and completedAt, as the content digest)."""
    p = Proposed()
    for batch in batches:
        for turn_id, seq, body, at in batch:
            p.apply(turn_id, seq, f"{body}@{at}", at)
    return p


def agree(*batches: list[Spec]) -> None:
    """``ChainBook`` folds the records as the model does: the same live chain, the same refusals."""
    model, b = oracle(*batches), book(*batches)
    assert [(i, f"{body}@{at}") for i, _, body, at in live(b)] == model.chain
    assert [r.split(" after")[0] for _, _, r in b.quarantined] == [
        f"seq {seq} leaves a gap" for _, seq in model.rejected
    ]


def proposed(*batches: list[Spec]) -> Proposed:
    p = Proposed()
    for batch in batches:
        for turn_id, seq, body, at in batch:
            p.apply(turn_id, seq, body, at)
    return p


def test_proposed_an_extra_turn_shifts_the_rest_and_later_turns_append() -> None:
    new = [
        ("t1", 1, "one", 10),
        ("x", 2, "interrupted", 15),
        ("t2", 3, "two", 20),
        ("t3", 4, "three", 30),
        ("t4", 5, "four", 40),
    ]
    p = proposed(OLD, new)
    assert p.chain == [(i, b) for i, _, b, _ in new] and not p.rejected


def test_proposed_a_full_reply_replaces_the_partial_one_and_the_turns_after_it_come_back() -> None:
    new = [("t1", 1, "one", 10), ("t2", 2, "two, the whole reply", 20), ("t3", 3, "three", 30)]
    p = proposed(OLD, new)
    assert p.chain == [(i, b) for i, _, b, _ in new] and not p.rejected


def test_proposed_a_dropped_turn_goes_and_the_rest_moves_up() -> None:
    old = [("t1", 1, "one", 10), ("bogus", 2, "made up", 15), ("t2", 3, "two", 20), ("t3", 4, "three", 30)]
    new = [("t1", 1, "one", 10), ("t2", 2, "two", 20), ("t3", 3, "three", 30), ("t4", 4, "four", 40)]
    p = proposed(old, new)
    assert p.chain == [(i, b) for i, _, b, _ in new] and not p.rejected


def test_proposed_same_parser_resends_are_duplicates_as_today() -> None:
    history = [*OLD, ("t4", 2, "after the rewind", 40)]
    for again in (history, [("t3", 3, "three", 30), ("t4", 2, "after the rewind", 40)], OLD[2:]):
        p = proposed(history, again)
        assert p.chain == [("t1", "one"), ("t4", "after the rewind")] and not p.rejected


# A host history: each prompt continues from an earlier prompt of the thread (its parent; a rewind
# when that is not the latest), as Claude Code's parentUuid tree. A parser renders each prompt's turn;
# an old parser missed some (dropped) and cut some replies short (partial).


@st.composite
def host_histories(draw: st.DrawFn, rewinds: bool = True) -> list[tuple[str, int | None]]:
    size = draw(st.integers(1, 12))
    out: list[tuple[str, int | None]] = []
    chain: list[int] = []  # the prompts of the thread as the host shows it (a rewind picks one of them)
    for i in range(size):
        cut = len(chain)
        if rewinds and chain and draw(st.integers(0, 4)) == 0:
            cut = draw(st.integers(0, len(chain) - 1))
        del chain[cut:]
        out.append((f"t{i}", chain[-1] if chain else None))
        chain.append(i)
    return out


def parse(
    history: list[tuple[str, int | None]], dropped: set[int], partial: set[int], made_up: frozenset[int] = frozenset()
) -> list[Spec]:
    """The records a parser sends: each kept prompt at the depth of its nearest kept ancestor + 1; after
    a prompt of ``made_up`` (kept), a turn it made up (of the same lines: completed before the next
    prompt), which the prompts continuing from it follow."""
    depth: dict[int, int] = {}
    out: list[Spec] = []
    for i, (turn_id, parent) in enumerate(history):
        while parent is not None and parent in dropped:
            parent = history[parent][1]
        d = 1 if parent is None else depth[parent] + 1
        if i in dropped:
            continue
        depth[i] = d
        cut = i in partial  # a reply cut short: completed at an earlier line
        out.append((turn_id, d, f"{turn_id} reply" + (" (cut)" if cut else ""), 10 * i - cut))
        if i in made_up:
            depth[i] = d + 1
            out.append((f"{turn_id}-made-up", d + 1, "made up", 10 * i + 5))
    return out


def abandoned(history: list[tuple[str, int | None]]) -> set[int]:
    """The prompts a later rewind left (not on the path from the last prompt to the root)."""
    kept, at = set(), len(history) - 1
    while at is not None:
        kept.add(at)
        at = history[at][1]
    return set(range(len(history))) - kept


def final_chain(records: list[Spec]) -> list[tuple[str, str]]:
    chain: list[tuple[str, str]] = []
    for turn_id, seq, body, _ in records:
        assert seq is not None
        del chain[seq - 1 :]
        chain.append((turn_id, body))
    return chain


@st.composite
def upgrades(draw: st.DrawFn, rewinds: bool = False) -> tuple[list[Spec], list[Spec]]:
    history = draw(host_histories(rewinds))
    n = len(history)
    final = set(range(n))
    if rewinds:  # the old parser erred only on turns of the thread's final chain
        final = {i for i, _ in enumerate(history)} - abandoned(history)
    dropped = set(draw(st.lists(st.sampled_from(sorted(final)), max_size=3)))
    partial = set(draw(st.lists(st.sampled_from(sorted(final)), max_size=3)))
    # a made-up turn the thread continues from (one at its end, no later record of the new parser undoes)
    inner = sorted(final - {n - 1})
    made_up = frozenset(draw(st.lists(st.sampled_from(inner), max_size=3))) if inner else frozenset()
    return parse(history, dropped, partial, made_up), parse(history, set(), set())


@st.composite
def interleaved(draw: st.DrawFn, records: list[Spec]) -> list[Spec]:
    """Two producers of the same records: the second re-sends them from any line (a lost or stale state, a
    hook beside a follower) once the first has sent the lines before it, interleaved in any way."""
    start = draw(st.integers(0, len(records)))
    second = records[start:]
    out: list[Spec] = []
    i = j = 0
    while i < len(records) or j < len(second):
        if j >= len(second) or i < start or (i < len(records) and draw(st.booleans())):
            out.append(records[i])
            i += 1
        else:
            out.append(second[j])
            j += 1
    return out


@settings(max_examples=400, deadline=None)
@given(st.one_of(upgrades(), upgrades(rewinds=True)), st.data())
def test_proposed_an_upgrade_ends_with_the_new_parsers_chain_and_rejects_nothing(
    pair: tuple[list[Spec], list[Spec]], data: st.DataObject
) -> None:
    old, new = pair
    p = proposed(old, new)
    assert p.chain == final_chain(new) and not p.rejected
    # and the new parser's records sent again by two producers, interleaved, change nothing
    again = data.draw(interleaved(new))
    p2 = proposed(old, new, again)
    assert p2.chain == final_chain(new) and not p2.rejected
    # the production fold agrees with the model
    agree(old, new)
    agree(old, new, again)


@settings(max_examples=400, deadline=None)
@given(host_histories(), st.data())
def test_proposed_one_parsers_records_interleaved_end_with_its_chain(
    history: list[tuple[str, int | None]], data: st.DataObject
) -> None:
    records = parse(history, set(), set())
    mixed = data.draw(interleaved(records))
    p = proposed(mixed)
    assert p.chain == final_chain(records) and not p.rejected
    # the production fold agrees on the final chain of the same interleaving
    assert [(i, b) for i, _, b, _ in live(book(mixed))] == final_chain(records)
    agree(mixed)


specs = st.lists(
    st.tuples(
        st.sampled_from([f"u{k}" for k in range(6)]),
        st.one_of(st.none(), st.integers(1, 7)),
        st.sampled_from(["a", "b", "c"]),
        st.integers(0, 1),
    ),
    max_size=40,
)


@settings(max_examples=400, deadline=None)
@given(specs)
def test_the_fold_agrees_with_the_model_on_any_history(records: list[Spec]) -> None:
    """Any records of one thread (ids re-sent with other content, other seqs, none, gaps)."""
    agree(records)


def test_an_extra_turn_and_a_dropped_one_before_a_turn_leave_it_where_it_was_and_the_chain_goes_on() -> None:
    # The new parser finds x and drops a turn the old one made up, both before t2, so t2 and t3 keep
    # their seqs. x's rewind supersedes them; their records, at the very seqs they were placed at, were
    # taken for stale re-sends (the chain was cut after x, t4 left a gap). Each completed after the
    # head (x, then t2), so each is placed again and t4 appends.
    old = [("t1", 1, "one", 10), ("bogus", 2, "made up", 15), ("t2", 3, "two", 20), ("t3", 4, "three", 30)]
    new = [("t1", 1, "one", 10), ("x", 2, "interrupted", 15), ("t2", 3, "two", 20), ("t3", 4, "three", 30)]
    agree(old, new, [("t4", 5, "four", 40)])
    b = book(old, new, [("t4", 5, "four", 40)])
    assert live(b) == [*new, ("t4", 5, "four", 40)] and not b.quarantined and not b.broken
    # the same with t2's reply cut short by the old parser (an earlier completedAt, other content)
    cut = [old[0], old[1], ("t2", 3, "tw", 18), old[3]]
    agree(cut, new, [("t4", 5, "four", 40)])
    assert live(book(cut, new, [("t4", 5, "four", 40)])) == [*new, ("t4", 5, "four", 40)]
    # and the new parser's records sent again change nothing
    assert live(book(old, new, new, [("t4", 5, "four", 40)])) == [*new, ("t4", 5, "four", 40)]


def test_a_host_rewind_placed_again_at_its_seq_after_the_turns_before_it_came_back_rewinds_again() -> None:
    # Why a superseded turn completed after the head is placed as a new turn would be, not only appended
    # at the next seq: the new parser finds x and drops m before c, so c and d come back at their seqs;
    # then the host's rewind e, re-sent at its seq 4 (now d's), must rewind over d again, as on the host.
    old = [("a", 1, "a", 10), ("m", 2, "made up", 25), ("c", 3, "c", 30), ("d", 4, "d", 40), ("e", 4, "e", 50)]
    new = [("a", 1, "a", 10), ("x", 2, "found", 20), ("c", 3, "c", 30), ("d", 4, "d", 40), ("e", 4, "e", 50)]
    p = proposed(old, new)
    assert p.chain == final_chain(new) == [("a", "a"), ("x", "found"), ("c", "c"), ("e", "e")] and not p.rejected
    agree(old, new, [("f", 5, "f", 60)])
    assert [i for i, *_ in live(book(old, new, [("f", 5, "f", 60)]))] == ["a", "x", "c", "e", "f"]


def test_a_turn_found_on_a_branch_the_host_left_before_its_rewind_ends_on_the_rewind() -> None:
    # The new parser finds x on the branch the user rewound away from (t4 rewinds to 2). x rewinds the
    # thread to 2 and t2, t3 follow it (moved); t4, completed after t3, is placed again: the thread
    # rewinds to it, as on the host (it was taken for a stale re-send, leaving the abandoned branch live).
    old = [*OLD, ("t4", 2, "after the rewind", 40)]
    new = [
        ("t1", 1, "one", 10),
        ("x", 2, "interrupted", 15),
        ("t2", 3, "two", 20),
        ("t3", 4, "three", 30),
        ("t4", 2, "after the rewind", 40),
    ]
    p = proposed(old, new)
    assert p.chain == final_chain(new) == [("t1", "one"), ("t4", "after the rewind")] and not p.rejected
    agree(old, new)
    agree(old, new, [("t5", 3, "five", 50)])
    b = book(old, new, [("t5", 3, "five", 50)])
    assert live(b) == [("t1", 1, "one", 10), ("t4", 2, "after the rewind", 40), ("t5", 3, "five", 50)]
    assert not b.quarantined


def test_proposed_limit_a_turn_found_on_a_branch_the_host_left_is_not_undone() -> None:
    # Known limit (docs/design.md): the new parser finds x on the branch the user rewound away from, at
    # seq 2, when the rewind (t4) went back to seq 1. x is a turn never applied at the next seq of the
    # chain [t4]: it appends, t2 and t3 follow it (moved), and t4 is live where it is (a duplicate).
    # Nothing is rejected, but the abandoned branch is served after t4 until the thread's next turn
    # (seq 2) rewinds over it.
    old = [("t1", 1, "one", 10), ("t2", 2, "two", 30), ("t3", 3, "three", 40), ("t4", 1, "after the rewind", 50)]
    new = [
        ("t1", 1, "one", 10),
        ("x", 2, "interrupted", 20),
        ("t2", 3, "two", 30),
        ("t3", 4, "three", 40),
        ("t4", 1, "after the rewind", 50),
    ]
    p = proposed(old, new)
    assert not p.rejected
    assert final_chain(new) == [("t4", "after the rewind")]
    assert p.chain == [("t4", "after the rewind"), ("x", "interrupted"), ("t2", "two"), ("t3", "three")]
    agree(old, new)
    b = book(old, new, [("t5", 2, "five", 60)])
    assert live(b) == [("t4", 1, "after the rewind", 50), ("t5", 2, "five", 60)] and not b.quarantined


def test_limit_a_stale_resend_across_a_rewind_the_host_clock_stepped_back_for_is_served_until_the_next_turn() -> None:
    # Known limit (docs/design.md): the rule assumes a rewind completes after the turns it leaves. Here
    # the host's clock stepped back between t3 and the rewind t4; an exact re-send of the history (a
    # follower with a lost state) brings t3 at seq 3, the next seq, completed after the head t4: it is
    # placed again, after t4, until the thread's next turn (seq 3) rewinds over it. Nothing is rejected.
    history = [*OLD, ("t4", 2, "after the rewind", 25)]
    agree(history, history)
    b = book(history, history)
    assert live(b) == [("t1", 1, "one", 10), ("t4", 2, "after the rewind", 25), ("t3", 3, "three", 30)]
    assert not b.quarantined
    b.apply(turn(turn_id="t5", seq=3, body="five", at=1_700_000_000_000_050), 0, 99)
    assert live(b) == [("t1", 1, "one", 10), ("t4", 2, "after the rewind", 25), ("t5", 3, "five", 50)]
    # a clock that stepped back further (before t2) ends on the branch the rewind left, for good: t2
    # (completed after t4) rewinds to 2, t3 follows, and t4, now older than the head, is a stale re-send;
    # the thread's next turn then follows t2 (the host's chain is t1, t4, t5)
    history = [*OLD, ("t4", 2, "after the rewind", 5)]
    agree(history, history, [("t5", 3, "five", 50)])
    assert [i for i, *_ in live(book(history, history, [("t5", 3, "five", 50)]))] == ["t1", "t2", "t5"]


# Why that limit cannot be avoided: the upgrade above (an extra turn and a dropped one before t2) and a
# follower's stale re-send across a host rewind are the same log when the host's clock stepped back
# across the rewind (docs/design.md, "Re-ingesting with a newer parser", known limits).
#
# Upgrade: the old parser made up "bogus" and missed x, both before t2; the new parser sends its chain.
UPGRADE_OLD = [("t1", 1, "one", 10), ("bogus", 2, "made up", 15), ("t2", 3, "two", 20), ("t3", 4, "three", 30)]
UPGRADE_NEW = [("t1", 1, "one", 10), ("x", 2, "interrupted", 15), ("t2", 3, "two", 20), ("t3", 4, "three", 30)]
# Host rewind: a hook sends a, b, c, e as they complete, then f, the user's rewind to seq 2 (completed
# at 15: the host's clock stepped back); a follower with a lost state sends the same lines again from
# line 1 (a, b, c, e, f), behind the hook: its b before the hook's f, its c and e after it, then its f.
HOOK = [("a", 1, "one", 10), ("b", 2, "made up", 15), ("c", 3, "two", 20), ("e", 4, "three", 30)]
FOLLOWER_AND_HOOK = [
    ("a", 1, "one", 10),
    ("b", 2, "made up", 15),
    ("f", 2, "interrupted", 15),  # the hook's rewind
    ("c", 3, "two", 20),
    ("e", 4, "three", 30),
    ("f", 2, "interrupted", 15),
]


def test_limit_the_upgrade_gap_is_the_log_of_a_stale_resend_across_a_clock_stepped_back_rewind() -> None:
    # Renamed, and without the follower's b and last f (exact re-sends of turns live where they are
    # when they come: duplicates), the two logs are record for record the same.
    rename = {"a": "t1", "b": "bogus", "c": "t2", "e": "t3", "f": "x"}
    follower = [(rename[i], seq, body, at) for i, seq, body, at in FOLLOWER_AND_HOOK]
    assert [(rename[i], *rest) for i, *rest in HOOK] == UPGRADE_OLD
    assert [follower[0], *follower[2:5]] == UPGRADE_NEW and follower[1] == UPGRADE_OLD[1]
    assert follower[5] == follower[2]
    # The host's chains differ: the new parser's [t1, x, t2, t3]; the rewound thread's [a, f]. The fold
    # closes the upgrade's gap, so it serves the follower's c and e after f, until the thread's next
    # turn (seq 3) rewinds over them.
    assert [i for i, *_ in live(book(UPGRADE_OLD, UPGRADE_NEW))] == ["t1", "x", "t2", "t3"]
    agree(HOOK, FOLLOWER_AND_HOOK, [("g", 3, "next", 40)])
    assert [i for i, *_ in live(book(HOOK, FOLLOWER_AND_HOOK))] == ["a", "f", "c", "e"]
    b = book(HOOK, FOLLOWER_AND_HOOK, [("g", 3, "next", 40)])
    assert [i for i, *_ in live(b)] == ["a", "f", "g"] and not b.quarantined
    # With the host's clock right (f completed after e), the logs differ by completedAt alone, and the
    # follower's c and e are stale re-sends.
    right = [(i, s, body, 35 if i == "f" else at) for i, s, body, at in FOLLOWER_AND_HOOK]
    agree(HOOK, right)
    assert [i for i, *_ in live(book(HOOK, right))] == ["a", "f"]
