"""The zig-zag varint reader shared by the Avro codec and the Kafka record-batch reader."""

from __future__ import annotations

import pytest
from hypothesis import given
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
