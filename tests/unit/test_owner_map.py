"""The group protocol's user data as values: ``MemberSubscription`` and ``OwnerMap`` (golden bytes, strict
decoding, round trips)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from throughline.core.assignment import assign_owners
from throughline.core.exceptions import GroupDataError
from throughline.core.owner_map import (
    OWNER_MAP_SCHEMA,
    SUBSCRIPTION_SCHEMA,
    GroupMember,
    MemberSubscription,
    OwnerMap,
)

GOLDEN_SUBSCRIPTION = (
    b'{"copies":2,"held":[0,3],"schema":"throughline.group_member.v1","stored":[0,3,5],"url":"http://127.0.0.1:8787"}'
)
GOLDEN_DEFAULT_SUBSCRIPTION = (
    b'{"copies":null,"held":[],"schema":"throughline.group_member.v1","stored":[],"url":"http://a:1"}'
)
GOLDEN_OWNER_MAP = (
    b'{"copies":2,"members":[{"id":"throughline-serve-a","url":"http://127.0.0.1:8001"},'
    b'{"id":"throughline-serve-b","url":"http://127.0.0.1:8002"},'
    b'{"id":"throughline-serve-c","url":"http://127.0.0.1:8003"}],'
    b'"owners":[[0,1],[0,2],[1,2],[0,1],[0,2],[1,2]],"partitions":6,"schema":"throughline.owner_map.v1"}'
)


def _three() -> OwnerMap:
    subs = {
        f"throughline-serve-{c}": MemberSubscription(url=f"http://127.0.0.1:800{i + 1}") for i, c in enumerate("abc")
    }
    return assign_owners(subs, 6)


def test_subscription_golden_bytes() -> None:
    value = MemberSubscription(
        url="http://127.0.0.1:8787", held=frozenset({3, 0}), stored=frozenset({5, 0, 3}), copies=2
    )
    assert value.encode() == GOLDEN_SUBSCRIPTION
    assert MemberSubscription.decode(GOLDEN_SUBSCRIPTION) == value
    assert MemberSubscription(url="http://a:1").encode() == GOLDEN_DEFAULT_SUBSCRIPTION
    assert MemberSubscription.decode(GOLDEN_DEFAULT_SUBSCRIPTION).copies is None


def test_owner_map_golden_bytes() -> None:
    owner_map = _three()
    assert owner_map.encode() == GOLDEN_OWNER_MAP
    assert OwnerMap.decode(GOLDEN_OWNER_MAP) == owner_map
    assert json.loads(GOLDEN_OWNER_MAP)["schema"] == OWNER_MAP_SCHEMA
    assert json.loads(GOLDEN_SUBSCRIPTION)["schema"] == SUBSCRIPTION_SCHEMA


def test_owner_map_queries() -> None:
    owner_map = _three()
    assert owner_map.urls(0) == ("http://127.0.0.1:8001", "http://127.0.0.1:8002")
    assert [m.member_id for m in owner_map.holders(2)] == ["throughline-serve-b", "throughline-serve-c"]
    assert owner_map.holders(6) == () and owner_map.urls(-1) == ()
    assert owner_map.partitions_of("throughline-serve-a") == frozenset({0, 1, 3, 4})
    assert owner_map.partitions_of("nobody") == frozenset()
    assert owner_map.member("throughline-serve-c") == GroupMember(
        url="http://127.0.0.1:8003", member_id="throughline-serve-c"
    )
    assert owner_map.member("nobody") is None
    assert owner_map.loads() == {"throughline-serve-a": 4, "throughline-serve-b": 4, "throughline-serve-c": 4}


def test_values_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        _three().copies = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        MemberSubscription(url="http://a:1").url = "http://b:1"  # type: ignore[misc]


@settings(max_examples=200)
@given(
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40),
    st.frozensets(st.integers(0, 10_000)),
    st.frozensets(st.integers(0, 10_000)),
    st.none() | st.integers(1, 1000),
)
def test_subscription_round_trips(url: str, held: frozenset[int], stored: frozenset[int], copies: int | None) -> None:
    value = MemberSubscription(url=url, held=held, stored=stored, copies=copies)
    assert MemberSubscription.decode(value.encode()) == value


@settings(max_examples=100)
@given(st.integers(1, 6), st.integers(0, 20), st.integers(1, 4))
def test_owner_map_round_trips(members: int, partitions: int, copies: int) -> None:
    subs = {f"id-{i}": MemberSubscription(url=f"http://h{i % 3}:1") for i in range(members)}
    owner_map = assign_owners(subs, partitions, copies)
    assert OwnerMap.decode(owner_map.encode()) == owner_map


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff\xfe",
        b"[]",
        b'{"schema":"throughline.group_member.v1"}',
        GOLDEN_SUBSCRIPTION.replace(b'"held":[0,3]', b'"held":[3,0]'),  # not canonical
        GOLDEN_SUBSCRIPTION.replace(b'"held":[0,3]', b'"held":[0,0,3]'),
        GOLDEN_SUBSCRIPTION.replace(b'"held":[0,3]', b'"held":[-1]'),
        GOLDEN_SUBSCRIPTION.replace(b'"held":[0,3]', b'"held":[true]'),
        GOLDEN_SUBSCRIPTION.replace(b'"held":[0,3]', b'"held":"0,3"'),
        GOLDEN_SUBSCRIPTION.replace(b'"copies":2', b'"copies":0'),
        GOLDEN_SUBSCRIPTION.replace(b'"copies":2', b'"copies":2.0'),
        GOLDEN_SUBSCRIPTION.replace(b"http://127.0.0.1:8787", b"http://a b"),
        GOLDEN_SUBSCRIPTION.replace(b'"url"', b'"extra":1,"url"'),
        GOLDEN_SUBSCRIPTION + b" ",
        GOLDEN_OWNER_MAP,  # the other document
    ],
)
def test_a_subscription_that_is_not_exactly_one_is_refused(data: bytes) -> None:
    with pytest.raises(GroupDataError) as caught:
        MemberSubscription.decode(data)
    assert caught.value.code == "group_data_malformed"
    assert not caught.value.retriable


@pytest.mark.parametrize(
    "data",
    [
        GOLDEN_OWNER_MAP.replace(b'"partitions":6', b'"partitions":7'),  # 6 owner lists
        GOLDEN_OWNER_MAP.replace(b"[0,1],[0,2],[1,2],[0,1]", b"[1,0],[0,2],[1,2],[0,1]"),
        GOLDEN_OWNER_MAP.replace(b"[0,1],[0,2],[1,2],[0,1]", b"[0,0],[0,2],[1,2],[0,1]"),
        GOLDEN_OWNER_MAP.replace(b"[0,1],[0,2],[1,2],[0,1]", b"[0,3],[0,2],[1,2],[0,1]"),
        GOLDEN_OWNER_MAP.replace(b"[0,1],[0,2],[1,2],[0,1]", b"[0],[0,2],[1,2],[0,1]"),
        GOLDEN_OWNER_MAP.replace(b'"copies":2', b'"copies":4'),
        GOLDEN_OWNER_MAP.replace(b"serve-b", b"serve-a"),  # two members with one id
        GOLDEN_OWNER_MAP.replace(b"8001", b"8009"),  # members out of order
        GOLDEN_OWNER_MAP.replace(b'{"id":"throughline-serve-a",', b'{"id":"throughline-serve-a","x":1,'),
        GOLDEN_OWNER_MAP.replace(b',"partitions":6', b',"partitions":6,"extra":[]'),
        GOLDEN_OWNER_MAP.replace(b'"partitions":6', b'"partitions": 6'),
        GOLDEN_SUBSCRIPTION,
    ],
)
def test_an_owner_map_that_is_not_exactly_one_is_refused(data: bytes) -> None:
    with pytest.raises(GroupDataError) as caught:
        OwnerMap.decode(data)
    assert caught.value.code == "group_data_malformed"


def test_another_version_is_told_apart() -> None:
    with pytest.raises(GroupDataError) as caught:
        OwnerMap.decode(GOLDEN_OWNER_MAP.replace(b"owner_map.v1", b"owner_map.v2"))
    assert caught.value.code == "group_data_version"
    with pytest.raises(GroupDataError) as caught:
        MemberSubscription.decode(GOLDEN_SUBSCRIPTION.replace(b"group_member.v1", b"group_member.v2"))
    assert caught.value.code == "group_data_version"


def test_oversized_data_is_refused_before_parsing() -> None:
    with pytest.raises(GroupDataError):
        OwnerMap.decode(b"[" * (5 * 1024 * 1024))


def test_an_empty_map_without_members_holds_nothing() -> None:
    empty = OwnerMap(partitions=2, copies=0, members=(), owners=((), ()))
    assert OwnerMap.decode(empty.encode()) == empty
    assert empty.urls(0) == ()
    with pytest.raises(GroupDataError):
        OwnerMap(partitions=2, copies=1, members=(), owners=((), ()))
