"""Content and chain digests: the canonical form, determinism, prefixes and tamper evidence."""

from __future__ import annotations

import hashlib
import struct
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from throughline.core.chain import (
    CHAIN_ORIGIN,
    chain_digests,
    content_digest,
    micros_since_epoch,
    next_chain_digest,
)

Turn = tuple[str, int, str]  # (turn id, completed at micros, body)

texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
turn_ids = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=20)
micros = st.integers(-(2**62), 2**62)
turns = st.tuples(turn_ids, micros, texts)
histories = st.lists(turns, max_size=12)


def digests(history: list[Turn]) -> list[bytes]:
    return chain_digests(content_digest(*t) for t in history)


def canonical_form(turn_id: str, at: int, body: str) -> bytes:
    """The canonical content form exactly as ``throughline.core.chain``'s docstring documents it."""
    tid, text = turn_id.encode("utf-8"), body.encode("utf-8")
    return (
        b"throughline.turn.v1\x00"
        + struct.pack(">Q", len(tid))
        + tid
        + struct.pack(">q", at)
        + struct.pack(">Q", len(text))
        + text
    )


# ---------------------------------------------------------------------------------------------- golden


def test_chain_origin_is_the_documented_constant() -> None:
    assert CHAIN_ORIGIN == hashlib.sha256(b"throughline.chain.v1").digest()


def test_golden_content_digest() -> None:
    # Pinned: every cursor ever issued embeds digests built on this; a change breaks them all.
    digest = content_digest("turn-1", 1_767_225_600_000_000, "héllo\nworld")
    assert digest == hashlib.sha256(canonical_form("turn-1", 1_767_225_600_000_000, "héllo\nworld")).digest()
    assert digest.hex() == "e0cf97948d17c797278dcf36f4a332b66ef0fc229924ee10c5feda4e13e120c3"


def test_golden_chain() -> None:
    history = [("a", 1, "one"), ("b", 2, "two"), ("c", 3, "thrée")]
    assert [d.hex() for d in digests(history)] == [
        "c2a39e9a8f13e5b989e2b7a52fec3108d4a9fb0f67082ae8b689e7e92f0f134f",
        "be20d677c8c86a81add861332e443c2cbd8cefb4e9fb2c4d2515022cacc37e6c",
        "6327e01b0432b422cb18e6a80f9eec50a67acf6614adcd043d14dfe3390ab93c",
    ]


@settings(max_examples=200)
@given(turns)
def test_content_digest_hashes_the_documented_canonical_form(turn: Turn) -> None:
    assert content_digest(*turn) == hashlib.sha256(canonical_form(*turn)).digest()


@settings(max_examples=100)
@given(histories)
def test_chain_digest_is_the_documented_recurrence(history: list[Turn]) -> None:
    previous = CHAIN_ORIGIN
    for turn, digest in zip(history, digests(history), strict=True):
        previous = hashlib.sha256(previous + content_digest(*turn)).digest()
        assert digest == previous


# ---------------------------------------------------------------------------------------------- properties


@given(histories)
def test_deterministic(history: list[Turn]) -> None:
    assert digests(history) == digests(list(history))


@given(histories, histories)
def test_prefix_property(head: list[Turn], tail: list[Turn]) -> None:
    whole = digests(head + tail)
    assert whole[: len(head)] == digests(head)
    # Continuing from d(len(head)) gives the same later digests as hashing the whole history.
    start = whole[len(head) - 1] if head else CHAIN_ORIGIN
    assert chain_digests((content_digest(*t) for t in tail), start) == whole[len(head) :]


def _mutate(turn: Turn, field: int, data: st.DataObject) -> Turn:
    tid, at, body = turn
    if field == 0:
        tid = data.draw(turn_ids.filter(lambda v: v != turn[0]), label="new turn id")
    elif field == 1:
        at = data.draw(micros.filter(lambda v: v != turn[1]), label="new time")
    else:
        body = data.draw(texts.filter(lambda v: v != turn[2]), label="new body")
    return (tid, at, body)


@settings(max_examples=300)
@given(st.lists(turns, min_size=1, max_size=10), st.data())
def test_changing_any_field_of_any_turn_changes_every_later_digest(history: list[Turn], data: st.DataObject) -> None:
    index = data.draw(st.integers(0, len(history) - 1), label="index")
    field = data.draw(st.integers(0, 2), label="field")
    changed = list(history)
    changed[index] = _mutate(history[index], field, data)
    before, after = digests(history), digests(changed)
    assert after[:index] == before[:index]
    for k in range(index, len(history)):
        assert after[k] != before[k], f"digest {k + 1} did not change"


def test_length_prefixes_keep_field_boundaries_apart() -> None:
    # Moving bytes between the turn id and the body must change the digest.
    assert content_digest("ab", 0, "c") != content_digest("a", 0, "bc")
    assert content_digest("", 0, "x") != content_digest("x", 0, "")


def test_order_matters() -> None:
    a, b = ("a", 1, "x"), ("b", 2, "y")
    assert digests([a, b])[-1] != digests([b, a])[-1]


def test_next_chain_digest_rejects_wrong_lengths() -> None:
    with pytest.raises(ValueError):
        next_chain_digest(b"short", bytes(32))
    with pytest.raises(ValueError):
        next_chain_digest(bytes(32), bytes(31))


def test_micros_since_epoch() -> None:
    assert micros_since_epoch(datetime(1970, 1, 1, tzinfo=UTC)) == 0
    assert micros_since_epoch(datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC)) == 1
    assert micros_since_epoch(datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)) == -1
    plus_two = timezone(timedelta(hours=2))
    assert micros_since_epoch(datetime(2026, 1, 1, 2, tzinfo=plus_two)) == micros_since_epoch(
        datetime(2026, 1, 1, tzinfo=UTC)
    )
    with pytest.raises(ValueError):
        micros_since_epoch(datetime(2026, 1, 1))
