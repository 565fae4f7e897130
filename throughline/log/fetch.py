"""kafka-python's consumer with throughline's record reader plugged into its fetcher.

``use_record_reader(consumer)`` makes the consumer's polls return ``FetchedRecord`` tuples (partition,
offset, key, value) read by ``throughline.log.record_batch`` instead of ``ConsumerRecord`` objects
built by kafka-python's pure-Python record parser, which cost the projector's fetch worker four times
as much a record. Everything around the records stays kafka-python's: connections, fetch sessions,
positions, the transactions' aborted ranges, and the batch-by-batch rules are kept as kafka-python's
``PartitionRecords._unpack_records`` has them (CRC check, aborted batches and transaction markers
skipped, the position moved past a batch whose last records were compacted away).

The hook replaces a nested class of kafka-python's ``Fetcher`` (no public API offers this), so it is
installed only on the kafka-python versions it is tested with (``TESTED_KAFKA_PYTHON``, the range
pyproject pins), where the fetcher has the shape it was written against, and only on a consumer
without deserializers; otherwise the consumer is left as it is and the call says so by returning
``False`` (tests/integration/test_record_reader.py pins that it installs on the kafka-python this
project is tested with, and that both readers return the same records).

Its records carry what the projector reads (partition, offset, key, value), not every attribute of
kafka-python's ``ConsumerRecord`` (``leader_epoch``, timestamps, headers): kafka-python's own iterator
(``for record in consumer``) reads ``leader_epoch``, so a hooked consumer is only ever polled, from
inside ``throughline.log.consumer.PartitionConsumer``, which offers nothing but ``poll``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import kafka.codec as codecs
import kafka.errors as kafka_errors
from kafka.consumer.fetcher import Fetcher
from kafka.version import __version__ as KAFKA_PYTHON_VERSION

from throughline.log.record_batch import (
    CONTROL_ABORT,
    CRC_START,
    BatchHeader,
    FetchedRecord,
    RecordBatchError,
    batch_magics,
    control_type,
    read_records,
    split_batches,
)

log = logging.getLogger(__name__)

#: kafka-python versions the hook is tested with, ``[low, high)`` (pyproject pins the same range).
TESTED_KAFKA_PYTHON = ((3, 0, 12), (3, 1, 0))


def _version_tuple(text: str) -> tuple[int, ...]:
    """(major, minor, micro) of a version string, missing parts as 0 ("3.1" is 3.1.0, not below it)."""
    parts: list[int] = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    if not parts:
        return ()
    return tuple(parts) + (0,) * (3 - len(parts))


def tested_kafka_python(version: str | None = None) -> bool:
    """Whether ``version`` of kafka-python (the installed one by default) is one the record reader hook
    is tested with."""
    low, high = TESTED_KAFKA_PYTHON
    return low <= _version_tuple(KAFKA_PYTHON_VERSION if version is None else version) < high


_BasePartitionRecords: Any = getattr(Fetcher, "PartitionRecords", None)
#: What ``_unpack_records`` below relies on, besides the constructor's attributes.
_NEEDED = ("_unpack_records", "_consume_aborted_transactions_up_to", "drain", "take")

try:
    from kafka.consumer.fetcher import IsolationLevel  # where kafka-python 3 has it

    _READ_COMMITTED: Any = IsolationLevel.READ_COMMITTED
except ImportError:  # pragma: no cover - another kafka-python: the hook is not installed
    _READ_COMMITTED = None

try:
    from kafka.record.util import calc_crc32c
except ImportError:  # pragma: no cover
    calc_crc32c = None

_DECOMPRESS = {
    1: ("gzip", codecs.has_gzip, codecs.gzip_decode),
    2: ("snappy", codecs.has_snappy, codecs.snappy_decode),
    3: ("lz4", codecs.has_lz4, codecs.lz4_decode),
    4: ("zstd", codecs.has_zstd, codecs.zstd_decode),
}


def _decompressed(data: bytes, batch: BatchHeader) -> bytes:
    entry = _DECOMPRESS.get(batch.compression)
    if entry is None:
        raise kafka_errors.UnsupportedCodecError(f"Unrecognized compression type: {batch.compression}")
    name, available, decode = entry
    if not available():
        raise kafka_errors.UnsupportedCodecError(f"Libraries for {name} compression codec not found")
    return bytes(decode(data[batch.records_start : batch.end]))


#: kafka-python's ``PartitionRecords`` yielding ``FetchedRecord``s (``None`` where it has no such class).
RecordReader: Any = None

if _BasePartitionRecords is not None:

    class _RecordReader(_BasePartitionRecords):
        """kafka-python's ``PartitionRecords`` yielding ``FetchedRecord``s read by ``record_batch``."""

        def _unpack_records(
            self, tp: Any, records: Any, key_deserializer: Any, value_deserializer: Any
        ) -> Iterator[Any]:
            data = records._buffer
            if not isinstance(data, bytes):
                data = bytes(data)
            if batch_magics(data) - {2}:
                # An old message format (a pre-2.0 topic): kafka-python's parser knows all of them.
                yield from super()._unpack_records(tp, records, key_deserializer, value_deserializer)
                return
            try:
                batches = split_batches(data)
            except RecordBatchError as exc:
                raise kafka_errors.CorruptRecordError(f"partition {tp}: {exc}") from None
            last = None
            for batch in batches:
                last = batch
                if self.check_crcs and calc_crc32c(memoryview(data)[batch.start + CRC_START : batch.end]) != batch.crc:
                    raise kafka_errors.CorruptRecordError(
                        f"Record batch for partition {tp} at offset {batch.base_offset} failed crc check"
                    )
                self.leader_epoch = batch.leader_epoch
                if self.isolation_level == _READ_COMMITTED and batch.producer_id > -1:
                    # As kafka-python: the aborted ranges that began before this batch's end name the
                    # producers whose next transactional batches are skipped, until their abort marker.
                    self._consume_aborted_transactions_up_to(batch.next_offset - 1)
                    if batch.is_control and control_type(data, batch.records_start) == CONTROL_ABORT:
                        self.aborted_producer_ids.discard(batch.producer_id)
                    elif batch.is_transactional and batch.producer_id in self.aborted_producer_ids:
                        self.next_fetch_offset = batch.next_offset
                        continue
                if batch.is_control:
                    self.next_fetch_offset = batch.next_offset
                    continue
                fetched: list[FetchedRecord] = []
                try:
                    if batch.compression:
                        payload = _decompressed(data, batch)
                        read_records(
                            payload, 0, len(payload), batch.record_count, batch.base_offset, tp.partition, fetched
                        )
                    else:
                        read_records(
                            data,
                            batch.records_start,
                            batch.end,
                            batch.record_count,
                            batch.base_offset,
                            tp.partition,
                            fetched,
                        )
                except RecordBatchError as exc:
                    raise kafka_errors.CorruptRecordError(f"partition {tp}: {exc}") from None
                self.records_read += len(fetched)
                self.bytes_read += batch.end - batch.start
                for record in fetched:
                    # Before the yield: a poll that stops inside the batch resumes after this record.
                    self.next_fetch_offset = record.offset + 1
                    yield record
            if last is not None:
                # The last records of a batch may have been compacted away; the next fetch starts
                # after the batch, not at its last surviving record.
                self.next_fetch_offset = last.next_offset
            self.drain()

    RecordReader = _RecordReader


def use_record_reader(consumer: Any, *, version: str | None = None) -> bool:
    """Make ``consumer``'s polls return ``FetchedRecord``s; ``False`` when it cannot be done safely.

    Call it before the first poll. The consumer must have no key or value deserializer (its records
    stay raw bytes either way). ``version``: the kafka-python version to judge (the installed one by
    default); on an untested one the consumer keeps kafka-python's own parser, whose ``ConsumerRecord``s
    carry the same partition, offset, key and value.
    """
    fetcher = getattr(consumer, "_fetcher", None)
    config = getattr(fetcher, "config", None)
    compatible = (
        tested_kafka_python(version)
        and RecordReader is not None
        and _READ_COMMITTED is not None
        and calc_crc32c is not None
        and type(fetcher) is Fetcher
        and isinstance(config, dict)
        and config.get("key_deserializer") is None
        and config.get("value_deserializer") is None
        and all(hasattr(_BasePartitionRecords, name) for name in _NEEDED)
    )
    if not compatible:
        log.warning(
            "kafka-python %s's fetcher is not the one throughline's record reader plugs into; using its own",
            KAFKA_PYTHON_VERSION if version is None else version,
        )
        return False
    fetcher.PartitionRecords = RecordReader  # type: ignore[union-attr]
    return True
