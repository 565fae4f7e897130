"""The laws of the group leader's partition assignment (``throughline.core.assignment``)."""

from __future__ import annotations

import itertools
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from throughline.core.assignment import DEFAULT_COPIES, agreed_copies, assign_owners
from throughline.core.owner_map import MemberSubscription, OwnerMap


@st.composite
def groups(
    draw: st.DrawFn, max_members: int = 5, max_partitions: int = 8
) -> tuple[dict[str, MemberSubscription], int, int | None]:
    """Subscriptions of 1..max_members members (any held/stored claims, even contradictory ones),
    a partition count and a requested K."""
    partitions = draw(st.integers(0, max_partitions))
    n = draw(st.integers(1, max_members))
    ids = draw(st.lists(st.text("abcxyz0123", min_size=1, max_size=4), min_size=n, max_size=n, unique=True))
    parts = st.frozensets(st.integers(0, max(0, partitions + 1)))  # a few out of range, as after a shrink
    subs = {
        member_id: MemberSubscription(
            url=f"http://127.0.0.1:{draw(st.integers(8000, 8003))}",  # duplicates allowed: ids tell apart
            held=draw(parts),
            stored=draw(parts),
            copies=draw(st.none() | st.integers(1, 4)),
        )
        for member_id in ids
    }
    copies = draw(st.none() | st.integers(1, 5))
    return subs, partitions, copies


def _wanted(subs: dict[str, MemberSubscription], copies: int | None) -> int:
    return agreed_copies(subs) if copies is None else copies


def _pairs(owner_map: OwnerMap) -> set[tuple[str, int]]:
    return {(m, p) for m in owner_map.loads() for p in owner_map.partitions_of(m)}


def _kept(subs: dict[str, MemberSubscription], owner_map: OwnerMap) -> int:
    return sum(1 for m, p in _pairs(owner_map) if p in subs[m].held)


def _warm(subs: dict[str, MemberSubscription], owner_map: OwnerMap) -> int:
    return sum(1 for m, p in _pairs(owner_map) if p not in subs[m].held and p in subs[m].stored)


def _previous(owner_map: OwnerMap, subs: dict[str, MemberSubscription]) -> dict[str, MemberSubscription]:
    """The subscriptions of the next join: every member held what ``owner_map`` gave it."""
    return {
        m: MemberSubscription(url=subs[m].url, held=owner_map.partitions_of(m), copies=subs[m].copies)
        for m in owner_map.loads()
    }


# ------------------------------------------------------------------------------------------ coverage


@settings(max_examples=300)
@given(groups())
def test_every_partition_goes_to_exactly_k_distinct_members(group: tuple) -> None:
    subs, partitions, copies = group
    owner_map = assign_owners(subs, partitions, copies)
    k = min(_wanted(subs, copies), len(subs))
    assert owner_map.copies == k
    assert owner_map.partitions == partitions
    assert {m.member_id for m in owner_map.members} == set(subs)
    for p in range(partitions):
        holders = owner_map.holders(p)
        assert len(holders) == k
        assert len({h.member_id for h in holders}) == k
    assert sum(owner_map.loads().values()) == partitions * k


def test_default_copies_are_two_and_one_member_holds_everything() -> None:
    two = {f"m{i}": MemberSubscription(url=f"http://h{i}") for i in range(3)}
    assert DEFAULT_COPIES == 2
    assert assign_owners(two, 6).copies == 2
    alone = {"m0": MemberSubscription(url="http://h0")}
    owner_map = assign_owners(alone, 6)
    assert owner_map.copies == 1
    assert owner_map.partitions_of("m0") == frozenset(range(6))


def test_copies_at_least_members_means_full_replicas() -> None:
    subs = {f"m{i}": MemberSubscription(url=f"http://h{i}", copies=3) for i in range(3)}
    owner_map = assign_owners(subs, 6)
    assert all(owner_map.partitions_of(m) == frozenset(range(6)) for m in subs)


def test_the_largest_requested_copies_win_whoever_leads() -> None:
    subs = {
        "a": MemberSubscription(url="http://h0", copies=1),
        "b": MemberSubscription(url="http://h1", copies=3),
        "c": MemberSubscription(url="http://h2"),
    }
    assert agreed_copies(subs) == 3
    assert agreed_copies({"c": subs["c"]}) == DEFAULT_COPIES
    assert assign_owners(subs, 4).copies == 3


def test_an_empty_group_or_topic_gives_an_empty_map() -> None:
    assert assign_owners({}, 3) == OwnerMap(partitions=3, copies=0, members=(), owners=((), (), ()))
    one = assign_owners({"m": MemberSubscription(url="http://h")}, 0)
    assert one.owners == () and one.copies == 1


@pytest.mark.parametrize("bad", [(-1, None), (3, 0), (3, -2)])
def test_nonsense_arguments_are_refused(bad: tuple[int, int | None]) -> None:
    partitions, copies = bad
    with pytest.raises(ValueError):
        assign_owners({"m": MemberSubscription(url="http://h")}, partitions, copies)


# ------------------------------------------------------------------------------------------- balance


@settings(max_examples=300)
@given(groups())
def test_loads_differ_by_at_most_one(group: tuple) -> None:
    subs, partitions, copies = group
    loads = assign_owners(subs, partitions, copies).loads().values()
    assert max(loads) - min(loads) <= 1


# ------------------------------------------------------------------------------------- determinism


@settings(max_examples=200)
@given(groups(), st.randoms(use_true_random=False))
def test_the_same_subscriptions_in_any_order_give_the_same_map(group: tuple, rnd: random.Random) -> None:
    subs, partitions, copies = group
    items = list(subs.items())
    rnd.shuffle(items)
    assert assign_owners(dict(items), partitions, copies) == assign_owners(subs, partitions, copies)
    assert assign_owners(subs, partitions, copies).encode() == assign_owners(dict(items), partitions, copies).encode()


# ----------------------------------------------------------------------------------------- stickiness


@settings(max_examples=200)
@given(groups())
def test_a_map_fed_back_is_kept_whole(group: tuple) -> None:
    subs, partitions, copies = group
    first = assign_owners(subs, partitions, copies)
    again = assign_owners(_previous(first, subs), partitions, copies)
    assert again == first


def _best_by_brute_force(subs: dict[str, MemberSubscription], partitions: int, k: int) -> tuple[int, int]:
    """The most kept pairs, then the most warm pairs, over every balanced assignment."""
    ids = sorted(subs)
    best = (-1, -1)
    for choice in itertools.product(itertools.combinations(ids, k), repeat=partitions):
        loads = dict.fromkeys(ids, 0)
        for holders in choice:
            for m in holders:
                loads[m] += 1
        if max(loads.values()) - min(loads.values()) > 1:
            continue
        kept = sum(1 for p, holders in enumerate(choice) for m in holders if p in subs[m].held)
        warm = sum(
            1 for p, holders in enumerate(choice) for m in holders if p not in subs[m].held and p in subs[m].stored
        )
        best = max(best, (kept, warm))
    return best


@settings(max_examples=150, deadline=None)
@given(groups(max_members=4, max_partitions=4))
def test_it_keeps_as_many_pairs_as_any_balanced_assignment_then_prefers_stored_rows(group: tuple) -> None:
    subs, partitions, copies = group
    owner_map = assign_owners(subs, partitions, copies)
    k = owner_map.copies
    assert (_kept(subs, owner_map), _warm(subs, owner_map)) == _best_by_brute_force(subs, partitions, k)


def _hand_on(before: OwnerMap, leaver: str, k: int) -> dict[str, set[int]] | None:
    """A witness: the survivors keep everything and take the leaver's partitions one by one, each to
    the least-loaded survivor that lacks it; ``None`` unless that ends balanced with k holders each."""
    held = {m: set(before.partitions_of(m)) for m in before.loads() if m != leaver}
    for p in sorted(before.partitions_of(leaver)):
        lacking = sorted((len(ps), m) for m, ps in held.items() if p not in ps)
        if not lacking:
            return None
        held[lacking[0][1]].add(p)
    loads = [len(ps) for ps in held.values()]
    holders = [sum(p in ps for ps in held.values()) for p in range(before.partitions)]
    return held if max(loads) - min(loads) <= 1 and all(h == k for h in holders) else None


@settings(max_examples=200)
@given(groups(max_members=6, max_partitions=12), st.data())
def test_a_member_leaving_moves_only_its_own_partitions_when_it_can(group: tuple, data: st.DataObject) -> None:
    subs, partitions, copies = group
    wanted = _wanted(subs, copies)
    before = assign_owners(subs, partitions, wanted)
    leaver = data.draw(st.sampled_from(sorted(subs)))
    rest = {m: s for m, s in _previous(before, subs).items() if m != leaver}
    after = assign_owners(rest, partitions, wanted)
    survivors_held = sum(len(s.held) for s in rest.values())
    if len(rest) >= wanted and _hand_on(before, leaver, after.copies) is not None:
        # Some balanced assignment keeps every survivor's partitions: so does this one.
        for m in rest:
            assert before.partitions_of(m) <= after.partitions_of(m), m
    elif len(rest) >= wanted:
        # The leaver's partitions cannot all go to survivors lacking them (one of each pair that
        # lacked room already held it): at most one more pair moves per partition it held.
        assert _kept(rest, after) >= survivors_held - len(before.partitions_of(leaver))
    else:  # fewer members than copies: every partition keeps all of its surviving holders
        assert _kept(rest, after) == partitions * after.copies


def test_a_leaver_whose_partition_every_spare_survivor_holds_costs_one_more_move() -> None:
    # "x" and "y" share partition 2; after x leaves, y is the one survivor with room but holds 2
    # already, so y takes 0 or 3 and the member who gave it up takes 2: two pairs move, not one.
    urls = {m: f"http://h/{m}" for m in ("a", "b", "c", "d", "x", "y")}
    layout = {"a": {0, 3}, "b": {0, 3}, "c": {1, 4}, "d": {1, 4}, "x": {2}, "y": {2}}
    subs = {m: MemberSubscription(url=urls[m], held=frozenset(ps)) for m, ps in layout.items()}
    assert _pairs(assign_owners(subs, 5)) == {(m, p) for m, ps in layout.items() for p in ps}
    rest = {m: s for m, s in subs.items() if m != "x"}
    after = assign_owners(rest, 5)
    assert set(after.loads().values()) == {2}
    assert _kept(rest, after) == 8  # of the survivors' 9 pairs: one moves beside the leaver's one


@settings(max_examples=200)
@given(groups(max_members=6, max_partitions=12))
def test_a_member_joining_takes_only_its_share(group: tuple) -> None:
    subs, partitions, copies = group
    wanted = _wanted(subs, copies)
    before = assign_owners(subs, partitions, wanted)
    joined = _previous(before, subs) | {"~joiner": MemberSubscription(url="http://127.0.0.1:9999")}
    after = assign_owners(joined, partitions, wanted)
    share = len(after.partitions_of("~joiner"))
    assert share in {partitions * after.copies // len(joined), -(-partitions * after.copies // len(joined))}
    if len(subs) >= wanted:  # the same number of copies: the old members only give
        for m in subs:
            assert after.partitions_of(m) <= before.partitions_of(m), m
        assert _kept(joined, after) == partitions * after.copies - share


def test_a_restarted_group_takes_back_the_partitions_its_files_hold() -> None:
    # Every member restarted (a new Kafka member id, nothing held): each one's file steers it home.
    urls = [f"http://127.0.0.1:{8000 + i}" for i in range(3)]
    first = assign_owners({f"old{i}": MemberSubscription(url=u) for i, u in enumerate(urls)}, 6)
    restarted = {
        f"new{i}": MemberSubscription(url=u, stored=first.partitions_of(f"old{i}")) for i, u in enumerate(urls)
    }
    second = assign_owners(restarted, 6)
    for i in range(3):
        assert second.partitions_of(f"new{i}") == first.partitions_of(f"old{i}")


def test_three_members_six_partitions_two_copies_then_a_fourth() -> None:
    urls = {f"m{i}": f"http://127.0.0.1:{8000 + i}" for i in range(4)}
    three = assign_owners({m: MemberSubscription(url=urls[m]) for m in ("m0", "m1", "m2")}, 6)
    assert three.loads() == {"m0": 4, "m1": 4, "m2": 4}
    joined = _previous(three, {m: MemberSubscription(url=u) for m, u in urls.items()}) | {
        "m3": MemberSubscription(url=urls["m3"])
    }
    four = assign_owners(joined, 6)
    assert four.loads() == {"m0": 3, "m1": 3, "m2": 3, "m3": 3}
    assert _kept(joined, four) == 9  # three slots moved, all to the joiner


# --------------------------------------------------------------------------------------------- cost


@pytest.mark.parametrize(("partitions", "members"), [(6, 3), (256, 16), (1000, 20)])
def test_a_rebalance_is_cheap_enough_for_the_leader(partitions: int, members: int) -> None:
    """Not a timing assertion: a bound far above the measured cost (~0.2 s for the largest on a loaded
    2-core machine), so that a quadratic-per-slot regression shows."""
    subs = {f"m{i:03}": MemberSubscription(url=f"http://h{i}") for i in range(members)}
    first = assign_owners(subs, partitions)
    joined = _previous(first, subs) | {"new": MemberSubscription(url="http://z")}
    started = time.process_time()
    after = assign_owners(joined, partitions)
    assert time.process_time() - started < 30
    assert sum(after.loads().values()) == partitions * 2
