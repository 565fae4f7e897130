"""``KeyFilter``: a key added is always reported maybe present, however the filter grew; a key never
added is rarely reported present."""

from __future__ import annotations

import hashlib
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from throughline.core.key_filter import KeyFilter

keys16 = st.binary(min_size=16, max_size=32)


@settings(max_examples=200, deadline=None)
@given(st.lists(keys16, max_size=300), st.integers(1, 64))
def test_every_key_added_is_maybe_present_across_growth(keys: list[bytes], capacity: int) -> None:
    f = KeyFilter(capacity)
    half = len(keys) // 2
    f.add_many(keys[:half])
    for key in keys[half:]:
        f.add(key)
    assert all(f.may_contain(k) for k in keys)
    assert f.count == len(keys)


def _digests(label: str, n: int) -> list[bytes]:
    return [hashlib.sha256(f"{label}{i}".encode()).digest()[:16] for i in range(n)]


def test_keys_never_added_are_rarely_reported() -> None:
    f = KeyFilter(1_000)  # grows to several filters: the rate stays bounded
    f.add_many(_digests("in", 20_000))
    assert f.size_bytes < 20_000 * 32 // 8 * 3  # a few bytes a key
    others = _digests("out", 50_000)
    reported = sum(f.may_contain(k) for k in others)
    expected = f.false_positive_rate() * len(others)
    assert f.false_positive_rate() < 1e-4
    assert reported <= max(5, 10 * expected), (reported, expected)


def test_an_empty_filter_reports_nothing_and_short_keys_are_refused() -> None:
    f = KeyFilter()
    assert not any(f.may_contain(k) for k in _digests("x", 1_000))
    with pytest.raises(ValueError, match="16 bytes"):
        f.add(b"short")
    with pytest.raises(ValueError, match="16 bytes"):
        f.may_contain(b"")


def test_threads_adding_at_once_lose_no_key() -> None:
    # Two writers setting bits of the same bytes: a lost read-modify-write would be a false negative.
    f = KeyFilter(64)  # small: both threads also grow it
    parts = [_digests(f"t{t}-", 20_000) for t in range(2)]
    threads = [
        threading.Thread(target=lambda ks=ks: [f.add_many(ks[i : i + 50]) for i in range(0, len(ks), 50)])
        for ks in parts
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(f.may_contain(k) for ks in parts for k in ks)


@settings(max_examples=100, deadline=None)
@given(st.lists(keys16, max_size=300), st.integers(1, 64), st.lists(keys16, max_size=50))
def test_a_filter_carried_as_bytes_answers_the_same(keys: list[bytes], capacity: int, others: list[bytes]) -> None:
    f = KeyFilter(capacity)
    f.add_many(keys)
    g = KeyFilter.from_bytes(f.to_bytes())
    assert g.count == f.count and g.size_bytes == f.size_bytes
    assert all(g.may_contain(k) for k in keys)
    assert [g.may_contain(k) for k in others] == [f.may_contain(k) for k in others]
    g.add_many(others)  # it goes on growing as the original would
    assert all(g.may_contain(k) for k in [*keys, *others])
    assert g.to_bytes() != f.to_bytes() or not others


def test_the_bytes_of_a_filter_are_pinned() -> None:
    # Format 1 (FORMAT): a rebuild's replay and the serve that adopts its filter may be different builds.
    f = KeyFilter(1)
    f.add_many(_digests("golden", 3))  # a second filter after the first key
    data = f.to_bytes()
    assert data[:11] == b"TLKF\x01\x08\x20" + (2).to_bytes(4, "little")  # 8 hashes, 32 bits a key, 2 filters
    assert data[11:28] == (1).to_bytes(8, "little") + (1).to_bytes(8, "little") + bytes([13])
    assert len(data) == 11 + 2 * 17 + 2 * 1024
    assert hashlib.sha256(data).hexdigest() == GOLDEN_FILTER_SHA256


GOLDEN_FILTER_SHA256 = "d73db4c889679e4b579e2c4d70b5d482c811daacae2a36659940eb3d7e142a1b"


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda b: b[:5], "shorter than its header"),
        (lambda b: b"XXXX" + b[4:], "wrong magic"),
        (lambda b: b[:4] + b"\x02" + b[5:], "format 2"),
        (lambda b: b[:5] + b"\x07" + b[6:], "7 hashes"),
        (lambda b: b[:-1], "cut short"),
        (lambda b: b + b"\x00", "1 more bytes"),
        (lambda b: b[:7] + (0).to_bytes(4, "little") + b[11:], "without filters"),
        (lambda b: b[:11] + (1 << 50).to_bytes(8, "little") + b[19:], r"keys in 2\*\*13 bits"),  # not allocated
    ],
)
def test_bytes_of_anything_else_are_refused(mangle, message: str) -> None:  # type: ignore[no-untyped-def]
    f = KeyFilter(1)
    f.add_many(_digests("bad", 3))
    with pytest.raises(ValueError, match=message):
        KeyFilter.from_bytes(mangle(f.to_bytes()))
