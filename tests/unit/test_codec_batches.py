"""Compressed record batches, every codec and the framings other clients write, through the record reader.

The projector's record reader (``throughline.log.fetch``) decompresses with kafka-python's codec module,
whose snappy, lz4 and zstd libraries are throughline's own dependencies (pyproject). Here each codec's
batch, as kafka-python builds it and re-framed as the Java client and librdkafka frame it, reads back
the same records as kafka-python's parser reads, without a broker. tests/integration/test_other_clients.py
does the same with the real clients through a broker.
"""

from __future__ import annotations

import struct
import tomllib
from collections.abc import Callable
from pathlib import Path

import kafka.codec as codecs
import lz4.frame
import pytest
import snappy
import zstandard
from kafka.consumer.fetcher import Fetcher
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kafka.record.util import calc_crc32c
from kafka.structs import TopicPartition

from throughline.log.fetch import RecordReader
from throughline.log.record_batch import BATCH_HEADER, CRC_START, split_batches

TP = TopicPartition("t", 1)
REPO = Path(__file__).resolve().parents[2]
#: Prose and code: compressible, and longer than one 32 KiB xerial block or 64 KiB lz4 block.
TEXT = b"".join(
    b"turn %d: the projector applies each poll in one transaction; def f(x): return x + %d\n" % (i, i)
    for i in range(1500)
)
RECORDS = [(bytes([i]) * 32, TEXT[i * 97 : i * 97 + 40_000]) for i in range(6)] + [(None, None), (b"k", b"")]


def _batch(compression: int) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for i, (key, value) in enumerate(RECORDS):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=key, value=value, headers=[])
    return bytes(builder.build())


def _reframed(compression: int, compress: Callable[[bytes], bytes]) -> bytes:
    """The uncompressed batch's records compressed by ``compress``, as codec ``compression``."""
    plain = bytearray(_batch(0))
    records = bytes(plain[BATCH_HEADER.size :])
    data = plain[: BATCH_HEADER.size] + compress(records)
    struct.pack_into(">i", data, 8, len(data) - 12)  # batchLength
    (attributes,) = struct.unpack_from(">h", data, 21)
    struct.pack_into(">h", data, 21, attributes | compression)
    struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[CRC_START:])))
    return bytes(data)


def _xerial(records: bytes) -> bytes:
    return codecs.snappy_encode(records, xerial_compatible=True, xerial_blocksize=32 * 1024)


def _streamed_zstd(records: bytes) -> bytes:
    stream = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    return stream.compress(records) + stream.flush()


def _stock(data: bytes) -> list[tuple]:
    return [
        (TP.partition, r.offset, r.key, r.value)
        for r in Fetcher.PartitionRecords(0, TP, MemoryRecords(data)).take(None)
    ]


def _ours(data: bytes) -> list[tuple]:
    return [tuple(r) for r in RecordReader(0, TP, MemoryRecords(data)).take(None)]


EXPECTED = [(TP.partition, i, key, value) for i, (key, value) in enumerate(RECORDS)]

FRAMINGS = {
    "gzip (kafka-python)": lambda: _batch(1),
    "snappy (kafka-python: xerial)": lambda: _batch(2),
    "lz4 (kafka-python)": lambda: _batch(3),
    "zstd (kafka-python)": lambda: _batch(4),
    # The Java client: snappy-java's SnappyOutputStream (xerial framing, 32 KiB blocks), LZ4 frames of
    # independent 64 KiB blocks without the content size, zstd-jni frames with the content size.
    "snappy (xerial, Java)": lambda: _reframed(2, _xerial),
    "lz4 (64 KiB independent blocks, Java)": lambda: _reframed(
        3,
        lambda b: lz4.frame.compress(b, block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False, store_size=False),
    ),
    # librdkafka: raw snappy (no framing), LZ4F frames with the content size and checksum, zstd
    # streaming frames without the content size, and a payload of two frames.
    "snappy (raw, librdkafka)": lambda: _reframed(2, snappy.compress),
    "lz4 (content size and checksum, librdkafka)": lambda: _reframed(
        3, lambda b: lz4.frame.compress(b, store_size=True, content_checksum=True, block_linked=False)
    ),
    "zstd (no content size, streamed)": lambda: _reframed(4, _streamed_zstd),
    "zstd (two frames)": lambda: _reframed(
        4,
        lambda b: (
            zstandard.ZstdCompressor().compress(b[: len(b) // 2])
            + zstandard.ZstdCompressor().compress(b[len(b) // 2 :])
        ),
    ),
}


@pytest.mark.parametrize("framing", list(FRAMINGS))
def test_the_record_reader_reads_every_codec_and_framing(framing: str) -> None:
    data = FRAMINGS[framing]()
    (batch,) = split_batches(data)
    assert batch.compression != 0 and batch.end - batch.start < len(_batch(0))  # compressed indeed
    assert _ours(data) == _stock(data) == EXPECTED


def test_a_fresh_install_has_every_codec() -> None:
    # kafka-python finds its codec libraries by import; pyproject's dependencies must bring each one.
    assert codecs.has_gzip() and codecs.has_snappy() and codecs.has_lz4() and codecs.has_zstd()
    with open(REPO / "pyproject.toml", "rb") as handle:
        dependencies = tomllib.load(handle)["project"]["dependencies"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip().lower() for d in dependencies}
    assert {"python-snappy", "lz4", "zstandard"} <= names
