"""Page tokens ``throughline.observer_page.v1`` (docs/spec.md#page-tokens, #page-token-binding).

Every refusal is a hard input error with a stable code, never rounded to ``resync_required``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from throughline.core.cursor import Cursor
from throughline.core.encoding import b64url_encode
from throughline.core.exceptions import PageTokenError
from throughline.core.page_token import (
    MAX_SAFE_INTEGER,
    MAX_TOKEN_BYTES,
    NULL_AFTER,
    SeriesBinding,
    check_offset_in_range,
    issue_page_token,
    open_page_token,
)

KEY = bytes(range(32))
PROJECT = hashlib.sha256(b"golden").digest()
THROUGH = Cursor(bytes(32), bytes([1]) * 32, 25, bytes([2]) * 32, 0, 40).encode()
AFTER = Cursor(bytes(32), bytes([1]) * 32, 5, bytes([3]) * 32, 0, 10).encode()
BINDING = SeriesBinding.of(PROJECT, AFTER, THROUGH)
TOKEN = issue_page_token(KEY, BINDING, 10)

GOLDEN_NULL_AFTER = (
    "tlp1.eyJhZnRlclNoYTI1NiI6IjAzYzBmZTE5Zjg1MGFkNTVlZTg4YjA1NTBlYWRiMTJiNDM5MjAxMjhiZmU0MzUxYTdhMzBlYWUy"
    "ZDRkOGI4YWEiLCJvZmZzZXQiOjIwLCJwcm9qZWN0U2hhMjU2IjoiZGQ1NmRlNDEzNzk1MWQ5YzkyNjgxYjAzNDE2ZWMxNWY4ODZi"
    "NDQ4MmEyN2UzYTUxN2QzMmYwODUyNDRjYmU1ZCIsInNjaGVtYSI6InRocm91Z2hsaW5lLm9ic2VydmVyX3BhZ2UudjEiLCJ0aHJv"
    "dWdoU2hhMjU2IjoiMDQ1NmJhMTUxNjdkZmU1MjllYjU3NDk1MmYwZDRlYzMxNWUxMzIyNzFkOTliOTA2MzhjZmNkMjgwZWQ0Njcx"
    "ZCJ9._4zWMZPZ0AeBZazmM1wdyeWSOaUR43EfldpZkiYuYq0"
)


def _sign(payload: bytes, key: bytes = KEY, version: str = "1") -> str:
    """Build a token by hand, independently of the module: the documented format."""
    tag = hmac.new(key, b"throughline.observer_page.v1\x00" + payload, hashlib.sha256).digest()
    return f"tlp{version}." + b64url_encode(payload) + "." + b64url_encode(tag)


def _payload(**overrides: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "afterSha256": hashlib.sha256(AFTER.encode()).hexdigest(),
        "offset": 10,
        "projectSha256": PROJECT.hex(),
        "schema": "throughline.observer_page.v1",
        "throughSha256": hashlib.sha256(THROUGH.encode()).hexdigest(),
    }
    doc.update(overrides)
    return doc


def _canonical(doc: object) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _refused(token: object, binding: SeriesBinding = BINDING, key: bytes = KEY) -> str:
    with pytest.raises(PageTokenError) as info:
        open_page_token(key, token, binding)
    assert info.value.exit_code == 2  # a hard input error
    return info.value.code


# ------------------------------------------------------------------------------------------------ format


def test_golden_bytes_null_after() -> None:
    binding = SeriesBinding.of(PROJECT, None, THROUGH)
    token = issue_page_token(KEY, binding, 20)
    expected_payload = _canonical(
        {
            "afterSha256": hashlib.sha256(b"throughline.observer_page.v1:null-after-cursor").hexdigest(),
            "offset": 20,
            "projectSha256": PROJECT.hex(),
            "schema": "throughline.observer_page.v1",
            "throughSha256": hashlib.sha256(THROUGH.encode()).hexdigest(),
        }
    )
    assert token == _sign(expected_payload)
    assert token == GOLDEN_NULL_AFTER
    assert open_page_token(KEY, GOLDEN_NULL_AFTER, binding) == 20


def test_golden_bytes_with_after() -> None:
    assert TOKEN == _sign(_canonical(_payload()))
    assert open_page_token(KEY, TOKEN, BINDING) == 10


def test_null_after_is_hashed_from_a_fixed_representation() -> None:
    binding = SeriesBinding.of(PROJECT, None, THROUGH)
    assert binding.after_sha256 == hashlib.sha256(NULL_AFTER).digest()
    # The fixed representation is not the hash of an empty string or of "null".
    assert binding.after_sha256 != hashlib.sha256(b"").digest()
    assert binding.after_sha256 != hashlib.sha256(b"null").digest()


def test_token_embeds_no_cursor_text_or_names() -> None:
    payload = base64.urlsafe_b64decode(TOKEN.split(".")[1] + "==")
    doc = json.loads(payload)
    assert set(doc) == {"afterSha256", "offset", "projectSha256", "schema", "throughSha256"}
    for piece in (AFTER, THROUGH, AFTER[5:40], THROUGH[5:40]):
        assert piece not in TOKEN
        assert piece.encode() not in payload
    assert len(TOKEN.encode()) <= MAX_TOKEN_BYTES


@given(st.integers(0, MAX_SAFE_INTEGER))
def test_round_trip_any_safe_offset(offset: int) -> None:
    assert open_page_token(KEY, issue_page_token(KEY, BINDING, offset), BINDING) == offset


@pytest.mark.parametrize("offset", [-1, MAX_SAFE_INTEGER + 1, True])
def test_issue_refuses_unsafe_offsets(offset: int) -> None:
    with pytest.raises(ValueError):
        issue_page_token(KEY, BINDING, offset)


def test_largest_token_is_far_below_the_bound() -> None:
    token = issue_page_token(KEY, BINDING, MAX_SAFE_INTEGER)
    assert len(token) < 1024


# ------------------------------------------------------------------------------------------ hard errors


def test_token_for_another_project() -> None:
    other = SeriesBinding.of(hashlib.sha256(b"other").digest(), AFTER, THROUGH)
    assert _refused(TOKEN, other) == "page_token_mismatch"


def test_token_for_another_after_cursor() -> None:
    other_after = Cursor(bytes(32), bytes([1]) * 32, 6, bytes([3]) * 32, 0, 11).encode()
    assert _refused(TOKEN, SeriesBinding.of(PROJECT, other_after, THROUGH)) == "page_token_mismatch"
    assert _refused(TOKEN, SeriesBinding.of(PROJECT, None, THROUGH)) == "page_token_mismatch"


def test_token_for_another_through_cursor() -> None:
    other_through = Cursor(bytes(32), bytes([1]) * 32, 26, bytes([2]) * 32, 0, 41).encode()
    assert _refused(TOKEN, SeriesBinding.of(PROJECT, AFTER, other_through)) == "page_token_mismatch"


def test_token_under_another_key() -> None:
    assert _refused(TOKEN, key=bytes(32)) == "page_token_tampered"


def test_another_version_prefix() -> None:
    parts = TOKEN.split(".")
    assert _refused("tlp2." + parts[1] + "." + parts[2]) == "page_token_version"
    assert _refused(_sign(_canonical(_payload()), version="2")) == "page_token_version"


def test_another_schema_version_inside_a_valid_mac() -> None:
    token = _sign(_canonical(_payload(schema="throughline.observer_page.v2")))
    assert _refused(token) == "page_token_version"


def test_oversize() -> None:
    assert _refused("tlp1." + "A" * MAX_TOKEN_BYTES) == "page_token_oversize"
    # Counted in UTF-8 bytes, not characters.
    assert _refused("é" * (MAX_TOKEN_BYTES // 2 + 1)) == "page_token_oversize"


def test_oversize_even_with_a_valid_mac() -> None:
    token = _sign(_canonical(_payload(padding="x" * MAX_TOKEN_BYTES)))
    assert _refused(token) == "page_token_oversize"


@pytest.mark.parametrize(
    "token",
    [
        "",
        "tlp1.",
        "tlp1..",
        "tlp1.eyJ9",
        "tlp.eyJ9.AAAA",
        "TLP1." + TOKEN[5:],
        TOKEN + "\n",
        " " + TOKEN,
        TOKEN + ".AAAA",
        TOKEN[: TOKEN.rindex(".")],  # no MAC
        TOKEN[: TOKEN.rindex(".") + 1] + b64url_encode(b"\x00" * 31),  # short MAC
        TOKEN + "=",
    ],
)
def test_malformed(token: str) -> None:
    assert _refused(token) == "page_token_malformed"


@pytest.mark.parametrize("token", [None, 0, b"tlp1.a.b", ["tlp1.a.b"]])
def test_not_a_string(token: object) -> None:
    assert _refused(token) == "page_token_malformed"


@pytest.mark.parametrize(
    "payload",
    [
        _canonical(_payload(offset=-1)),
        _canonical(_payload(offset=MAX_SAFE_INTEGER + 1)),
        _canonical(_payload(offset=1.0)),
        _canonical(_payload(offset="10")),
        _canonical(_payload(offset=True)),
        _canonical(_payload(offset=None)),
        _canonical(_payload(projectSha256=PROJECT.hex().upper())),
        _canonical(_payload(projectSha256=PROJECT.hex()[:-2])),
        _canonical(_payload(afterSha256=None)),
        _canonical(_payload(extra=1)),
        _canonical({k: v for k, v in _payload().items() if k != "throughSha256"}),
        _canonical({k: v for k, v in _payload().items() if k != "schema"}),
        _canonical([1, 2]),
        _canonical("tlp"),
        b"not json",
        b"\xff\xfe",
    ],
)
def test_exact_schema_validation_behind_a_valid_mac(payload: bytes) -> None:
    assert _refused(_sign(payload)) == "page_token_malformed"


def test_offset_past_the_range() -> None:
    check_offset_in_range(4, 5)
    with pytest.raises(PageTokenError) as info:
        check_offset_in_range(5, 5)
    assert info.value.code == "page_token_offset"
    with pytest.raises(PageTokenError):
        check_offset_in_range(0, 0)


# ------------------------------------------------------------------------------------------ tampering


@settings(max_examples=300)
@given(st.data())
def test_any_single_changed_char_is_refused(data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(TOKEN) - 1), label="position")
    c = data.draw(st.characters(codec="ascii").filter(lambda ch: ch != TOKEN[i]), label="char")
    with pytest.raises(PageTokenError):
        open_page_token(KEY, TOKEN[:i] + c + TOKEN[i + 1 :], BINDING)


@settings(max_examples=300)
@given(st.data())
def test_any_single_flipped_bit_is_refused(data: st.DataObject) -> None:
    raw = bytearray(TOKEN.encode("ascii"))
    i = data.draw(st.integers(0, len(raw) - 1), label="byte")
    raw[i] ^= 1 << data.draw(st.integers(0, 7), label="bit")
    with pytest.raises(PageTokenError):
        open_page_token(KEY, raw.decode("latin-1"), BINDING)


def test_every_position_with_a_neighbouring_char_is_refused() -> None:
    # Exhaustive over positions (the property above samples them): the next char of the alphabet.
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_."
    for i, ch in enumerate(TOKEN):
        replacement = alphabet[(alphabet.index(ch) + 1) % len(alphabet)] if ch in alphabet else "A"
        with pytest.raises(PageTokenError):
            open_page_token(KEY, TOKEN[:i] + replacement + TOKEN[i + 1 :], BINDING)


def test_dropping_or_inserting_a_char_is_refused() -> None:
    for i in range(len(TOKEN)):
        with pytest.raises(PageTokenError):
            open_page_token(KEY, TOKEN[:i] + TOKEN[i + 1 :], BINDING)
        with pytest.raises(PageTokenError):
            open_page_token(KEY, TOKEN[:i] + "A" + TOKEN[i:], BINDING)
