"""Kafka record batches (message format v2) read straight into plain tuples.

kafka-python parses every record of a fetch in pure Python through several objects (a record, a
``ConsumerRecord`` of thirteen fields, two deserializer calls, a header-size sum): ~6-9 us a record,
more than the projector spends on anything else it does in its fetch worker. The projector needs only
each record's offset, key and value, so this module reads those, and nothing else, off the fetched
bytes: ~1.5 us a record. ``throughline.log.fetch`` plugs it into kafka-python's fetcher, which still
does everything else (connections, fetch sessions, positions, transactions' aborted ranges).

Pure: no Kafka client import, so the format is tested byte for byte against kafka-python's own
batch builder (tests/unit/test_record_batch.py) without a broker.

The layout (https://kafka.apache.org/documentation/#recordbatch)::

    baseOffset int64, batchLength int32, partitionLeaderEpoch int32, magic int8, crc uint32,
    attributes int16, lastOffsetDelta int32, baseTimestamp int64, maxTimestamp int64,
    producerId int64, producerEpoch int16, baseSequence int32, recordCount int32, records...

    record: length varint, attributes int8, timestampDelta varlong, offsetDelta varint,
            keyLength varint, key, valueLength varint, value, headerCount varint,
            headers [keyLength varint, key, valueLength varint, value]
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from throughline.core.encoding import read_zigzag

BATCH_HEADER = struct.Struct(">qiiBIhiqqqhii")
#: Bytes before ``batchLength`` counts (baseOffset and batchLength themselves).
LOG_OVERHEAD = 12
#: Where the CRC-32C's coverage starts (the attributes), from the batch's first byte.
CRC_START = 21
_MAGIC_AT = 16

COMPRESSION_MASK = 0x07
TRANSACTIONAL = 0x10
CONTROL = 0x20
#: Control record types (the key of a control batch's one record).
CONTROL_ABORT = 0
CONTROL_COMMIT = 1


class RecordBatchError(ValueError):
    """The fetched bytes are not well-formed v2 record batches (a corrupt or misread fetch)."""


class FetchedRecord(NamedTuple):
    """One record as the projector reads it: where it is and its raw bytes."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class BatchHeader(NamedTuple):
    """A v2 batch's header, and where the batch lies in the fetched bytes (``start`` to ``end``)."""

    base_offset: int
    length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    start: int
    end: int

    @property
    def compression(self) -> int:
        """The codec id (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd)."""
        return self.attributes & COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        """Written by a transactional producer."""
        return bool(self.attributes & TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        """A transaction marker, not data."""
        return bool(self.attributes & CONTROL)

    @property
    def next_offset(self) -> int:
        """The offset after the batch's last (even when compaction removed that record)."""
        return self.base_offset + self.last_offset_delta + 1

    @property
    def records_start(self) -> int:
        """Where the (possibly compressed) records begin."""
        return self.start + BATCH_HEADER.size


def batch_magics(data: bytes) -> set[int]:
    """The message format versions (magic bytes) of the whole batches in ``data``."""
    magics: set[int] = set()
    pos, size = 0, len(data)
    while pos + _MAGIC_AT + 1 <= size:
        length = int.from_bytes(data[pos + 8 : pos + LOG_OVERHEAD], "big", signed=True)
        end = pos + LOG_OVERHEAD + length
        if length < 0 or end > size:
            break
        magics.add(data[pos + _MAGIC_AT])
        pos = end
    return magics


def split_batches(data: bytes) -> list[BatchHeader]:
    """The v2 batches in a partition's fetched bytes, in order.

    A fetch may end in a partial batch (the broker cuts at the fetch size): it is left out, as the
    consumer fetches it whole next time. Raises ``RecordBatchError`` for a batch of another format
    or a header that contradicts itself.
    """
    batches: list[BatchHeader] = []
    pos, size = 0, len(data)
    while pos + BATCH_HEADER.size <= size:
        fields = BATCH_HEADER.unpack_from(data, pos)
        length = fields[1]
        end = pos + LOG_OVERHEAD + length
        if end > size:
            break
        if fields[3] != 2:
            raise RecordBatchError(f"batch at offset {fields[0]} has message format v{fields[3]}, not v2")
        if length < BATCH_HEADER.size - LOG_OVERHEAD or fields[12] < 0:
            raise RecordBatchError(f"batch at offset {fields[0]} has an impossible header")
        batches.append(BatchHeader._make((*fields, pos, end)))
        pos = end
    return batches


def read_records(
    buf: bytes, pos: int, end: int, count: int, base_offset: int, partition: int, out: list[FetchedRecord]
) -> None:
    """Append the ``count`` records in ``buf[pos:end]`` (a batch's uncompressed records) to ``out``.

    Keys and values are ``bytes`` (``buf`` must be ``bytes`` for that); headers are skipped. Raises
    ``RecordBatchError`` when a record's length disagrees with its fields or bytes are left over.
    """
    append = out.append
    p = pos
    try:
        for _ in range(count):
            # A one-byte varint is the common case of every field but the value's length; the branch
            # for it saves a call a field (this loop is the projector's per-record fetch cost).
            b = buf[p]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                length, p = read_zigzag(buf, p)
            start = p
            p += 1  # attributes (int8, unused)
            b = buf[p]
            if b < 0x80:
                p += 1
            else:
                _, p = read_zigzag(buf, p)  # timestamp delta (the projector reads the turn's own time)
            b = buf[p]
            if b < 0x80:
                delta = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                delta, p = read_zigzag(buf, p)
            b = buf[p]
            if b < 0x80:
                size = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                size, p = read_zigzag(buf, p)
            if size >= 0:
                key: bytes | None = buf[p : p + size]
                p += size
            else:
                key = None
            b = buf[p]
            if b < 0x80:
                size = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                size, p = read_zigzag(buf, p)
            if size >= 0:
                value: bytes | None = buf[p : p + size]
                p += size
            else:
                value = None
            b = buf[p]
            if b < 0x80:
                headers = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                headers, p = read_zigzag(buf, p)
            if headers:
                p = _skip_headers(buf, p, headers)
            if p - start != length:
                raise RecordBatchError(
                    f"record at offset {base_offset + delta} is {length} bytes long but its fields take {p - start}"
                )
            append(FetchedRecord(partition, base_offset + delta, key, value))
    except IndexError:
        raise RecordBatchError(f"batch at offset {base_offset} ends inside a record") from None
    except RecordBatchError:
        raise
    except ValueError as exc:  # a varint longer than 64 bits
        raise RecordBatchError(f"batch at offset {base_offset}: {exc}") from None
    if p != end:
        raise RecordBatchError(f"batch at offset {base_offset} has {end - p} bytes after its {count} records")


def _skip_headers(buf: bytes, p: int, count: int) -> int:
    if count < 0:
        raise RecordBatchError(f"a record with {count} headers")
    for _ in range(count):
        size, p = read_zigzag(buf, p)
        if size < 0:
            raise RecordBatchError("a record header without a key")
        p += size
        size, p = read_zigzag(buf, p)
        if size > 0:
            p += size
    return p


def control_type(buf: bytes, pos: int) -> int | None:
    """The type of the control record starting at ``pos`` (``CONTROL_ABORT``, ``CONTROL_COMMIT``, ...)."""
    try:
        _, p = read_zigzag(buf, pos)  # length
        p += 1  # attributes
        _, p = read_zigzag(buf, p)  # timestamp delta
        _, p = read_zigzag(buf, p)  # offset delta
        size, p = read_zigzag(buf, p)
        if size < 4:
            return None
        return int.from_bytes(buf[p + 2 : p + 4], "big", signed=True)  # key: version int16, type int16
    except (IndexError, ValueError):
        return None
