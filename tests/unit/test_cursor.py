"""Cursors: versioned, opaque, hash-only, one spelling per value (docs/spec.md#cursor)."""

from __future__ import annotations

import base64
import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from throughline.core.cursor import MAX_CURSOR_CHARS, Cursor, ForeignCursor, decode_cursor
from throughline.core.encoding import b64url_encode
from throughline.core.exceptions import InvalidCursorError
from throughline.core.identity import project_sha256, source_sha256

hashes = st.binary(min_size=32, max_size=32)
cursors = st.builds(
    Cursor,
    project_sha256=hashes,
    source_sha256=hashes,
    length=st.integers(1, 2**63 - 1),
    chain_digest=hashes,
    partition=st.integers(0, 2**31 - 1),
    offset=st.integers(0, 2**63 - 1),
)


def _sample() -> Cursor:
    p = project_sha256("/home/alice/secret-project")
    return Cursor(p, source_sha256(p, "host-a", "thread-1"), 7, hashlib.sha256(b"d7").digest(), 3, 12345)


@given(cursors)
def test_round_trip(cursor: Cursor) -> None:
    text = cursor.encode()
    assert text.startswith("tlc1.")
    assert decode_cursor(text) == cursor


@given(cursors, cursors)
def test_distinct_cursors_have_distinct_strings(a: Cursor, b: Cursor) -> None:
    assert (a.encode() == b.encode()) == (a == b)


def test_golden_encoding() -> None:
    cursor = Cursor(bytes(range(32)), bytes(range(32, 64)), 5, bytes(range(64, 96)), 2, 99)
    payload = (
        bytes(range(32))
        + bytes(range(32, 64))
        + (5).to_bytes(8, "big")
        + bytes(range(64, 96))
        + (2).to_bytes(4, "big")
        + (99).to_bytes(8, "big")
    )
    assert cursor.encode() == "tlc1." + base64.urlsafe_b64encode(payload).rstrip(b"=").decode()
    assert len(payload) == 116


def test_holds_no_raw_names() -> None:
    text = _sample().encode()
    decoded_payload = base64.urlsafe_b64decode(text[5:] + "==")
    for raw in ("alice", "secret-project", "host-a", "thread-1"):
        assert raw not in text
        assert raw.encode() not in decoded_payload


def test_foreign_version_is_not_an_input_error() -> None:
    body = _sample().encode()[5:]
    for text in ("tlc2." + body, "tlc9999.AAAA"):
        decoded = decode_cursor(text)
        assert isinstance(decoded, ForeignCursor)
        assert decoded.text == text
    assert decode_cursor("tlc2.x") == ForeignCursor(2, "tlc2.x")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "tlc1.",
        "tlc1",
        "tlc.AAAA",
        "tlc01." + _sample().encode()[5:],  # a second spelling of the version
        "tlc0." + _sample().encode()[5:],
        "tlc10000.AAAA",  # version too long
        "TLC1." + _sample().encode()[5:],
        " " + _sample().encode(),
        _sample().encode() + "\n",  # `$` would have accepted this
        _sample().encode() + " ",
        _sample().encode() + "=",  # padding is not part of the encoding
        _sample().encode()[:-1],  # truncated payload
        _sample().encode() + "AAAA",  # payload too long
        "tlc1." + b64url_encode(b"\x00" * 115),
        "tlc1.!!!!",
        "tlc1." + "A" * (MAX_CURSOR_CHARS + 1),
    ],
)
def test_malformed_cursor_is_a_hard_error(text: str) -> None:
    with pytest.raises(InvalidCursorError) as info:
        decode_cursor(text, field="afterCursor")
    assert info.value.code == "invalid_cursor"
    assert info.value.exit_code == 2
    assert "afterCursor" in info.value.message


@pytest.mark.parametrize("value", [None, 1, b"tlc1.AAAA", ["tlc1."]])
def test_non_string_is_a_hard_error(value: object) -> None:
    with pytest.raises(InvalidCursorError):
        decode_cursor(value)


def test_non_canonical_base64_is_refused() -> None:
    text = _sample().encode()
    # 116 bytes -> 155 chars with 2 spare bits in the last char; setting them is another spelling.
    last = text[-1]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    sibling = alphabet[alphabet.index(last) ^ 1]
    with pytest.raises(InvalidCursorError):
        decode_cursor(text[:-1] + sibling)


@pytest.mark.parametrize(
    ("length", "partition", "offset"),
    [(0, 0, 0), (1, -1, 0), (1, 2**31, 0), (1, 0, -1), (2**63, 0, 0), (1, 0, 2**63)],
)
def test_numbers_out_of_range_are_refused(length: int, partition: int, offset: int) -> None:
    with pytest.raises(ValueError):
        Cursor(b"a" * 32, b"b" * 32, length, b"c" * 32, partition, offset)


def test_decoded_numbers_out_of_range_are_input_errors() -> None:
    payload = b"a" * 32 + b"b" * 32 + (0).to_bytes(8, "big") + b"c" * 32 + (0).to_bytes(4, "big") + bytes(8)
    with pytest.raises(InvalidCursorError):
        decode_cursor("tlc1." + b64url_encode(payload))
    payload = b"a" * 32 + b"b" * 32 + (1).to_bytes(8, "big") + b"c" * 32 + (2**31).to_bytes(4, "big") + bytes(8)
    with pytest.raises(InvalidCursorError):
        decode_cursor("tlc1." + b64url_encode(payload))


def test_hashes_must_be_32_bytes() -> None:
    with pytest.raises(ValueError):
        Cursor(b"a" * 31, b"b" * 32, 1, b"c" * 32, 0, 0)


@given(cursors, st.data())
def test_any_single_changed_char_changes_or_refuses(cursor: Cursor, data: st.DataObject) -> None:
    text = cursor.encode()
    i = data.draw(st.integers(0, len(text) - 1))
    c = data.draw(st.characters(codec="ascii").filter(lambda ch: ch != text[i]))
    changed = text[:i] + c + text[i + 1 :]
    try:
        decoded = decode_cursor(changed)
    except InvalidCursorError:
        return
    assert decoded != cursor
