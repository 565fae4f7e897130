"""Damaged lengths against the current-version reader's fast paths.

The reader reads a string whose length fits one byte inline, checking the zig-zag sign bit itself; a
record whose length byte says ``-(n + 1)`` (the byte ``2n + 1``) has every later field where it belongs,
so only that check refuses it. Here each length of a record is damaged on purpose (negative, too long,
too short, more bytes than it needs, past 64 bits) and the reader must agree with fastavro: the same
datum, or ``RecordDecodeError`` where fastavro refuses.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_codec import GOLDEN_V2, _any_fields, _fastavro_datum, _our_datum, _reference_datum

from throughline.core.encoding import read_zigzag
from throughline.core.turn import TurnRecord
from throughline.schemas.codec import HEADER_BYTES, decode_turn_datum, encode_turn
from throughline.schemas.exceptions import RecordDecodeError


def _zigzag(n: int) -> bytes:
    """Avro's varint of ``n`` (no range check: a damage may be wider than a long)."""
    z = (n << 1) ^ (n >> 63) if -(1 << 63) <= n < (1 << 63) else (n << 1 if n >= 0 else (-n << 1) - 1)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def length_fields(record: bytes) -> list[tuple[str, int, int, int]]:
    """Every string length of a current-version record: (field, where its varint starts, where it
    ends, the length), walking the schema's fixed field order."""
    out: list[tuple[str, int, int, int]] = []
    p = HEADER_BYTES

    def string(name: str) -> None:
        nonlocal p
        size, end = read_zigzag(record, p)
        if size < 0 or end + size > len(record):  # a damaged record: its fields are not where they were
            raise ValueError("not a current-version record")
        out.append((name, p, end, size))
        p = end + size

    string("project")
    p += 32
    for name in ("host", "thread", "turnId"):
        string(name)
    branch, p = read_zigzag(record, p)
    if branch == 1:
        _, p = read_zigzag(record, p)
    _, p = read_zigzag(record, p)  # completedAt
    string("body")
    p += 32
    string("producer.name")
    string("producer.version")
    _, p = read_zigzag(record, p)  # producedAt
    count, p = read_zigzag(record, p)
    while count:
        for _ in range(count):
            string("attribute key")
            string("attribute value")
        count, p = read_zigzag(record, p)
    assert p == len(record), "not a current-version record"
    return out


def _with_length(record: bytes, field: tuple[str, int, int, int], put: bytes) -> bytes:
    _, start, end, _ = field
    return record[:start] + put + record[end:]


GOLDEN = bytes.fromhex(GOLDEN_V2)
GOLDEN_FIELDS = length_fields(GOLDEN)


def test_the_walk_finds_every_string_of_the_golden_record() -> None:
    names = [f[0] for f in GOLDEN_FIELDS]
    assert names == [
        "project",
        "host",
        "thread",
        "turnId",
        "body",
        "producer.name",
        "producer.version",
        "attribute key",
        "attribute value",
    ]
    assert all(end == start + 1 for _, start, end, _ in GOLDEN_FIELDS)  # every length fits one byte


@pytest.mark.parametrize("field", GOLDEN_FIELDS, ids=[f[0] for f in GOLDEN_FIELDS])
def test_a_one_byte_length_with_its_sign_bit_set_is_refused(field: tuple[str, int, int, int]) -> None:
    # The byte 2n + 1 is the zig-zag of -(n + 1); read without its sign it is n, so every later field
    # stays aligned and the record would decode whole: only the reader's sign check refuses it.
    name, start, _, size = field
    damaged = _with_length(GOLDEN, field, bytes([2 * size + 1]))
    assert _fastavro_datum(damaged) is None
    assert _reference_datum(damaged) == (None, False)
    with pytest.raises(RecordDecodeError, match="negative size"):
        decode_turn_datum(damaged)


def _damages(size: int, width: int) -> st.SearchStrategy[bytes]:
    """Replacements for a length ``size`` written in ``width`` bytes."""
    return st.one_of(
        st.integers(1, 1 << 20).map(lambda k: _zigzag(-k)),  # negative
        st.just(bytes([2 * size + 1])) if size < 64 else st.just(_zigzag(-size - 1)),  # the sign bit alone
        st.integers(1, 1 << 20).map(lambda k: _zigzag(size + k)),  # longer than the bytes that follow
        st.integers(1, max(1, size)).map(lambda k: _zigzag(max(0, size - k))),  # shorter
        st.integers(1, max(1, 9 - width)).map(lambda k: _pad(_zigzag(size), k)),  # the same length in more bytes
        st.integers(0, 4).map(lambda k: _pad(_zigzag(size), 10 - len(_zigzag(size)) + k)),  # ten bytes or more
        st.integers(1 << 62, (1 << 70) - 1).map(_zigzag),  # past what a record holds, or past 64 bits
        st.sampled_from([b"", b"\x80", b"\xff"]),  # cut short: the varint runs into the next field
    )


def _pad(varint: bytes, extra: int) -> bytes:
    """``varint`` written with ``extra`` more bytes (continuation bits and zero groups): the same value."""
    if extra <= 0:
        return varint
    return varint[:-1] + bytes([varint[-1] | 0x80]) + b"\x80" * (extra - 1) + b"\x00"


@st.composite
def damaged_lengths(draw: st.DrawFn) -> bytes:
    """A record (the golden one or any generated turn) with one or two of its string lengths damaged."""
    turn: TurnRecord | None = draw(st.none() | _any_fields, label="turn")
    record = GOLDEN if turn is None else encode_turn(turn)
    for _ in range(draw(st.integers(1, 2), label="damages")):
        try:
            fields = length_fields(record)
        except (AssertionError, IndexError, ValueError):
            break  # the first damage moved the fields: the record is damaged enough
        field = draw(st.sampled_from(fields), label="field")
        _, start, end, size = field
        record = _with_length(record, field, draw(_damages(size, end - start), label="length"))
    return record


@settings(max_examples=800, suppress_health_check=[HealthCheck.too_slow])
@given(damaged_lengths())
def test_the_reader_agrees_with_fastavro_on_damaged_lengths(record: bytes) -> None:
    # The same datum, or RecordDecodeError where the reference refuses (fastavro's reading held to the
    # two Avro rules it leaves unchecked, test_codec._StrictDecoder); where the record breaks neither,
    # fastavro's C reader agrees too.
    expected, broke_an_unchecked_rule = _reference_datum(record)
    assert _our_datum(record) == expected
    if not broke_an_unchecked_rule:
        assert _fastavro_datum(record) == expected
