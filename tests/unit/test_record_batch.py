"""throughline's record-batch reader against kafka-python's own batch builder and parser (no broker).

The reader replaces kafka-python's per-record parser in the projector's consumer, so it must return
exactly the records kafka-python returns for any batch kafka-python can build, and refuse what
kafka-python refuses as corrupt.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.consumer.fetcher import Fetcher
from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kafka.record.util import calc_crc32c
from kafka.structs import TopicPartition

from throughline.log.fetch import RecordReader
from throughline.log.record_batch import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    FetchedRecord,
    RecordBatchError,
    batch_magics,
    control_type,
    read_records,
    split_batches,
)

TP = TopicPartition("t", 4)

optional_bytes = st.one_of(st.none(), st.binary(max_size=300))
headers = st.lists(st.tuples(st.text(max_size=8), optional_bytes), max_size=3)
record = st.tuples(optional_bytes, optional_bytes, headers, st.integers(0, 1 << 40))
batch = st.lists(record, min_size=1, max_size=40)


def _batch(records: list, *, base_offset: int, compression: int = 0, offset_step: int = 1) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for i, (key, value, hdrs, ts) in enumerate(records):
        builder.append(i * offset_step, timestamp=ts, key=key, value=value, headers=hdrs)
    data = builder.build()
    struct.pack_into(">q", data, 0, base_offset)  # the broker assigns the base offset
    return bytes(data)


def _stock(data: bytes, fetch_offset: int = 0) -> list[tuple]:
    got = Fetcher.PartitionRecords(fetch_offset, TP, MemoryRecords(data)).take(None)
    return [(TP.partition, r.offset, r.key, r.value) for r in got]


def _ours(data: bytes, fetch_offset: int = 0) -> list[tuple]:
    return [tuple(r) for r in RecordReader(fetch_offset, TP, MemoryRecords(data)).take(None)]


@settings(max_examples=150, deadline=None)
@given(st.lists(batch, min_size=1, max_size=4), st.sampled_from([0, 1]), st.integers(1, 3), st.integers(0, 1 << 40))
def test_reader_returns_what_kafka_python_returns(batches, compression, step, base):
    data = b""
    offset = base
    for records in batches:
        data += _batch(records, base_offset=offset, compression=compression, offset_step=step)
        offset += len(records) * step
    ours = _ours(data)
    assert ours == _stock(data)
    assert len(ours) == sum(map(len, batches))


@settings(max_examples=50, deadline=None)
@given(batch, st.integers(0, 60))
def test_a_fetch_that_starts_inside_a_batch_skips_the_records_before_it(records, start):
    data = _batch(records, base_offset=0)
    assert _ours(data, start) == _stock(data, start)


@settings(max_examples=50, deadline=None)
@given(batch, st.integers(1, 200))
def test_a_fetch_cut_inside_its_last_batch_returns_the_whole_batches(records, cut):
    first = _batch(records, base_offset=0)
    second = _batch(records, base_offset=len(records))
    data = first + second[: max(0, len(second) - cut)]
    assert [b.base_offset for b in split_batches(data)] == [0]
    assert _ours(data) == _stock(data) == _stock(first)


def test_a_poll_that_stops_inside_a_batch_resumes_after_its_last_record():
    data = _batch([(b"k", b"v%d" % i, [], 0) for i in range(10)], base_offset=100)
    reader = RecordReader(100, TP, MemoryRecords(data))
    first = reader.take(4)
    assert [r.offset for r in first] == [100, 101, 102, 103]
    assert reader.next_fetch_offset == 104
    rest = reader.take(None)
    assert [r.offset for r in rest] == list(range(104, 110))
    assert reader.next_fetch_offset == 110


def test_large_varints_and_values_read_back():
    big = b"x" * 70_000  # a three-byte length
    records = [(b"k" * 200, big, [("h", b"y" * 300)], 1 << 40)]
    data = _batch(records, base_offset=(1 << 40))
    assert _ours(data) == _stock(data) == [(4, 1 << 40, b"k" * 200, big)]


def test_keys_and_values_are_bytes():
    (rec,) = _ours(_batch([(b"key", b"value", [], 0)], base_offset=0))
    assert type(rec[2]) is bytes and type(rec[3]) is bytes


def test_a_flipped_byte_fails_the_crc_check_as_in_kafka_python():
    data = bytearray(_batch([(b"k", b"value", [], 0)], base_offset=0))
    data[-2] ^= 0xFF
    for read in (_ours, _stock):
        with pytest.raises(CorruptRecordError):
            read(bytes(data))


@pytest.mark.parametrize("damage", ["longer", "shorter"])
def test_a_record_whose_length_disagrees_with_its_fields_is_refused(damage):
    data = _batch([(b"k", b"value", [], 0)], base_offset=0)
    records_at = 61
    length = data[records_at] >> 1
    body = data[records_at + 1 :]
    if damage == "longer":
        body = body + b"\x00"
        length += 1
    else:
        body = body[:-1]
        length -= 1
    out: list[FetchedRecord] = []
    raw = bytes([length << 1]) + body
    with pytest.raises(RecordBatchError):
        read_records(raw, 0, len(raw), 1, 0, 0, out)


def test_bytes_left_after_the_records_are_refused():
    data = _batch([(b"k", b"value", [], 0)], base_offset=0)
    raw = data[61:] + b"\x00"
    with pytest.raises(RecordBatchError, match="bytes after"):
        read_records(raw, 0, len(raw), 1, 0, 0, [])


def test_a_batch_that_ends_inside_a_record_is_refused():
    data = _batch([(b"k", b"value" * 10, [], 0)], base_offset=0)
    raw = data[61:-5]
    with pytest.raises(RecordBatchError, match="ends inside"):
        read_records(raw, 0, len(raw), 1, 0, 0, [])


def test_a_varint_longer_than_64_bits_is_refused():
    raw = b"\xff" * 10 + b"\x01" + b"\x00" * 20  # the record's length
    with pytest.raises(RecordBatchError, match="64 bits"):
        read_records(raw, 0, len(raw), 1, 0, 0, [])


#: A ten-byte varint whose tenth byte holds more than bit 63: not a 64-bit value (docs/design.md,
#: "Varints"); read without the check it is -13835058055282163712, which no Kafka field can hold.
WIDE = bytes.fromhex("ffffffffffffffffff02")


def _record(
    *, timestamp_delta: bytes = b"\x00", offset_delta: bytes = b"\x00", header_key: bytes | None = None
) -> bytes:
    """One v2 record built by hand (no key, no value), with the given raw varints."""
    headers = b"\x00" if header_key is None else b"\x02" + header_key + b"\x01"  # one header, no value
    body = b"\x00" + timestamp_delta + offset_delta + b"\x01" + b"\x01" + headers
    assert len(body) < 64
    return bytes([len(body) << 1]) + body


@pytest.mark.parametrize("field", ["timestamp_delta", "offset_delta", "header_key"])
def test_a_varint_wider_than_64_bits_is_refused(field):
    raw = _record(**{field: WIDE})
    with pytest.raises(RecordBatchError, match="past 64 bits"):
        read_records(raw, 0, len(raw), 1, 0, 0, [])


def test_a_fetched_batch_with_a_wide_varint_is_a_corrupt_record_error():
    # Through the consumer's path (fetch.py): a CRC-valid batch whose one record has a wide timestamp
    # delta surfaces as kafka-python's CorruptRecordError, as any malformed batch does.
    data = bytearray(_batch([(None, None, [], 0)], base_offset=7))
    records = _record(timestamp_delta=WIDE)
    data[61:] = records
    struct.pack_into(">i", data, 8, len(data) - 12)  # batchLength
    struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    assert _ours(bytes(_batch([(None, None, [], 0)], base_offset=7))) == [(4, 7, None, None)]
    with pytest.raises(CorruptRecordError, match="past 64 bits"):
        _ours(bytes(data))


def test_other_message_formats_are_named_not_parsed():
    data = bytearray(_batch([(b"k", b"v", [], 0)], base_offset=0))
    assert batch_magics(bytes(data)) == {2}
    data[16] = 1
    assert batch_magics(bytes(data)) == {1}
    with pytest.raises(RecordBatchError, match="v1"):
        split_batches(bytes(data))


@pytest.mark.parametrize("kind", [CONTROL_ABORT, CONTROL_COMMIT])
def test_control_record_type(kind):
    data = _batch([(struct.pack(">hh", 0, kind), b"\x00\x00\x00\x00\x00\x00", [], 0)], base_offset=0)
    assert control_type(data, 61) == kind
