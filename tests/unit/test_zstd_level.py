"""The zstd level of kafka-python's record batches (``throughline.log.zstd_level``), which reaches into
kafka-python's batch builder: these tests fail loudly when a kafka-python release moves what it relies
on (then see pyproject's kafka-python pin), and show that a batch kafka-python builds is compressed at
the level set, reads back whole, and that kafka-python's own encoder comes back on request."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import kafka.codec as kafka_codec
import pytest
import zstandard
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

from throughline.log import zstd_level
from throughline.log.zstd_level import KAFKA_PYTHON_LEVEL, use_zstd_level, zstd_seam
from throughline.producers import producer

#: Turn-like text: compressible, and unlike at level 1 and level 3.
BODIES = [
    (
        b"turn %d: the projector applies each poll in one transaction; def next_%d(x): return x + %d\n"
        % (i, i % 7, i)
    )
    * (5 + i % 11)
    for i in range(300)
]
CODEC_ZSTD = 4


@pytest.fixture(autouse=True)
def _restore_the_producers_level() -> Iterator[None]:
    yield
    use_zstd_level(producer.ZSTD_LEVEL)


def _batch(records: list[bytes]) -> tuple[bytes, bytes]:
    """A zstd batch as kafka-python's producer builds it (``MemoryRecordsBuilder``, closed when the
    sender drains it): its bytes, and the uncompressed records it compressed."""
    builder = MemoryRecordsBuilder(magic=2, compression_type=CODEC_ZSTD, batch_size=1 << 22)
    plain = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 22,
    )
    for i, value in enumerate(records):
        assert builder.append(timestamp=1_000 + i, key=b"k%d" % i, value=value) is not None
        assert plain.append(i, 1_000 + i, b"k%d" % i, value, []) is not None
    builder.close()
    header = DefaultRecordBatchBuilder.HEADER_STRUCT.size
    return bytes(builder.buffer()), bytes(plain.build()[header:])


def _frame(batch: bytes) -> bytes:
    return batch[DefaultRecordBatchBuilder.HEADER_STRUCT.size :]


def test_kafka_python_still_has_the_seam() -> None:
    # A failure here: this kafka-python no longer compresses its zstd batches through
    # kafka.record.default_records.zstd_encode; TurnProducer's zstd level silently falls back to 3.
    assert zstd_seam() is None
    assert "zstd_encode" in DefaultRecordBatchBuilder._maybe_compress.__code__.co_names


def test_importing_the_producer_sets_its_level() -> None:
    assert producer.COMPRESSION == "zstd" and producer.ZSTD_LEVEL != KAFKA_PYTHON_LEVEL
    assert zstd_level.zstd_level() == producer.ZSTD_LEVEL


def test_a_batch_kafka_python_builds_is_compressed_at_the_level_set() -> None:
    assert use_zstd_level(1)
    batch, records = _batch(BODIES)
    level1 = zstandard.ZstdCompressor(level=1).compress(records)
    level3 = zstandard.ZstdCompressor(level=3).compress(records)
    assert level1 != level3  # the data tells the levels apart
    assert _frame(batch) == level1
    read = list(MemoryRecords(batch).next_batch())
    assert [r.value for r in read] == BODIES and [r.key for r in read] == [
        b"k%d" % i for i in range(len(BODIES))
    ]


def test_none_brings_back_kafka_pythons_own_encoder() -> None:
    assert use_zstd_level(None)
    assert zstd_level.zstd_level() == KAFKA_PYTHON_LEVEL
    batch, records = _batch(BODIES)
    assert (
        _frame(batch)
        == kafka_codec.zstd_encode(records)
        == zstandard.ZstdCompressor(level=3).compress(records)
    )


def test_a_level_zstandard_refuses_fails_when_set_not_in_a_sender_thread() -> None:
    with pytest.raises(ValueError):
        use_zstd_level(99)
    assert zstd_level.zstd_level() == producer.ZSTD_LEVEL  # the level before stays


def test_producers_threads_each_compress_with_their_own_compressor() -> None:
    # Every producer's sender thread compresses at once; one shared compressor would mix their frames.
    encode = zstd_level.LevelEncoder(1)
    failures: list[int] = []

    def compress(start: int) -> None:
        for i in range(start, start + 150):
            body = BODIES[i % len(BODIES)] * (1 + i % 3)
            if zstandard.ZstdDecompressor().decompress(encode(body)) != body:
                failures.append(i)

    threads = [threading.Thread(target=compress, args=(k * 150,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert failures == [] and not any(t.is_alive() for t in threads)
