"""The zig-zag varint reader shared by the Avro codec and the Kafka record-batch reader."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from throughline.core.encoding import read_zigzag
from throughline.schemas.codec import _long

longs = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)


@given(longs, st.binary(max_size=4), st.binary(max_size=4))
def test_read_zigzag_inverts_avros_long_encoding(n: int, before: bytes, after: bytes) -> None:
    encoded = _long(n)
    assert read_zigzag(before + encoded + after, len(before)) == (n, len(before) + len(encoded))


@given(longs)
def test_a_varint_cut_short_raises_index_error(n: int) -> None:
    encoded = _long(n)
    with pytest.raises(IndexError):
        read_zigzag(encoded[:-1], 0)


def test_a_varint_longer_than_64_bits_raises_value_error() -> None:
    with pytest.raises(ValueError, match="64 bits"):
        read_zigzag(b"\xff" * 10 + b"\x01", 0)


@pytest.mark.parametrize(
    "varint",
    [
        "ffffffffffffffffff02",  # ten bytes, the tenth holding bit 64: fastavro's C reader wraps it
        "80808089fce288d2a306",  # the damaged producedAt (two 0x80 put in): 28954224246784000000
        "8080808080808080807f",
    ],
)
def test_a_ten_byte_varint_whose_value_runs_past_64_bits_is_refused(varint: str) -> None:
    with pytest.raises(ValueError, match="past 64 bits"):
        read_zigzag(bytes.fromhex(varint), 0)


def test_the_widest_ten_byte_varints_are_the_64_bit_extremes() -> None:
    assert read_zigzag(bytes.fromhex("feffffffffffffffff01"), 0) == ((1 << 63) - 1, 10)
    assert read_zigzag(bytes.fromhex("ffffffffffffffffff01"), 0) == (-(1 << 63), 10)
    assert read_zigzag(bytes.fromhex("80808080808080808000"), 0) == (0, 10)  # padded, as Avro allows


def _by_the_rule(data: bytes) -> tuple[int, int] | type[Exception]:
    """The 64-bit varint rule spelled out (docs/design.md, "Varints"): up to ten bytes of 7 bits each,
    least significant first, the last without the high bit; the unsigned value must fit 64 bits."""
    z = 0
    for i, b in enumerate(data[:10]):
        z |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            return ((z >> 1) ^ -(z & 1), i + 1) if z < 1 << 64 else ValueError
    return ValueError if len(data) >= 10 else IndexError


#: Runs of continuation bytes and a last byte: varints of any length and width, most of them bad.
varint_like = st.builds(
    lambda run, rest: bytes(run) + rest,
    st.lists(st.integers(0x80, 0xFF), max_size=12),
    st.binary(max_size=2),
)


@given(varint_like)
@example(bytes.fromhex("80808089fce288d2a306"))
@example(b"\x80" * 10 + b"\x00")
def test_read_zigzag_follows_the_64_bit_rule(data: bytes) -> None:
    expected = _by_the_rule(data)
    if isinstance(expected, tuple):
        value, end = read_zigzag(data, 0)
        assert (value, end) == expected
        assert -(1 << 63) <= value < 1 << 63
    else:
        with pytest.raises(expected):
            read_zigzag(data, 0)
