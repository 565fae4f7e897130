"""The zstd level of the record batches kafka-python compresses in this process.

kafka-python 3.0 has no compression-level setting. Its batch builder
(``kafka.record.default_records.DefaultRecordBatchBuilder._maybe_compress``, run by the producer's
sender thread as it drains a batch) compresses a zstd batch with the ``zstd_encode`` of that module's
namespace, which builds a new ``zstandard.ZstdCompressor()`` for every batch: zstandard's default
level 3. ``use_zstd_level`` swaps that one name for an encoder at another level that keeps one
compressor per thread (a compressor is not safe to share between threads, and every producer has its
own sender thread). The frames are ordinary zstd frames, as before: a reader decompresses any level.

This reaches into kafka-python's internals; pyproject pins the kafka-python versions it was tested
with, and ``zstd_seam`` says whether the internals still look the way this module expects. When they
do not, ``use_zstd_level`` leaves kafka-python alone and returns false: batches are then compressed at
level 3, as kafka-python does (slower, never wrong). The level applies to every kafka-python producer
of the process, as the name it replaces is the module's, not a producer's.
"""

from __future__ import annotations

import logging
import threading

import zstandard
from kafka import codec as kafka_codec
from kafka.record import default_records

#: kafka-python's own level (zstandard's default, ``ZstdCompressor()``).
KAFKA_PYTHON_LEVEL = 3
_NAME = "zstd_encode"
#: kafka-python's encoder, as its batch builder imported it.
_KAFKA_PYTHON_ENCODE = kafka_codec.zstd_encode
_lock = threading.Lock()
log = logging.getLogger(__name__)


class LevelEncoder:
    """``zstd_encode(payload)`` at a fixed level, one reused compressor per calling thread."""

    def __init__(self, level: int) -> None:
        zstandard.ZstdCompressor(level=level)  # a level zstandard refuses fails here, not in a sender thread
        self.level = level
        self._local = threading.local()

    def __call__(self, payload: bytes) -> bytes:
        compressor = getattr(self._local, "compressor", None)
        if compressor is None:
            compressor = self._local.compressor = zstandard.ZstdCompressor(level=self.level)
        return compressor.compress(payload)


def zstd_seam() -> str | None:
    """What keeps ``use_zstd_level`` from taking effect in this kafka-python, or ``None`` when nothing does."""
    builder = getattr(default_records, "DefaultRecordBatchBuilder", None)
    compress = getattr(builder, "_maybe_compress", None)
    code = getattr(compress, "__code__", None)
    if code is None:
        return "kafka.record.default_records.DefaultRecordBatchBuilder._maybe_compress is gone"
    if _NAME not in code.co_names:
        return "DefaultRecordBatchBuilder._maybe_compress no longer calls its module's zstd_encode"
    current = getattr(default_records, _NAME, None)
    if current is not _KAFKA_PYTHON_ENCODE and not isinstance(current, LevelEncoder):
        return "kafka.record.default_records.zstd_encode is not kafka.codec.zstd_encode"
    if not kafka_codec.has_zstd():
        return "kafka-python finds no zstandard"
    return None


def use_zstd_level(level: int | None) -> bool:
    """Compress kafka-python's zstd batches of this process at ``level`` from the next batch on
    (``None``: kafka-python's own encoder again); true when the level is in effect."""
    with _lock:
        problem = zstd_seam()
        if problem is not None:
            log.warning("zstd batches stay at kafka-python's level %d: %s", KAFKA_PYTHON_LEVEL, problem)
            return False
        encoder = _KAFKA_PYTHON_ENCODE if level is None else LevelEncoder(level)
        setattr(default_records, _NAME, encoder)
        return True


def zstd_level() -> int:
    """The level kafka-python's zstd batches are compressed at in this process now."""
    current = getattr(default_records, _NAME, None)
    return current.level if isinstance(current, LevelEncoder) else KAFKA_PYTHON_LEVEL
