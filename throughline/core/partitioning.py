"""Which partition holds a project: Kafka's default partitioner over the project hash key.

Records are keyed by the 32-byte project SHA-256, so all turns of a project share one partition and are
totally ordered. We choose the partition ourselves with the same murmur2 function Kafka's Java client
uses for keyed records, so any Kafka client that keys by project hash agrees with throughline, and the
reader can compute a project's partition without the producer.
"""

from __future__ import annotations

from functools import lru_cache


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (as ``org.apache.kafka.common.utils.Utils.murmur2``), as a signed 32-bit int."""
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    r = 24
    h = (seed ^ length) & 0xFFFFFFFF
    length4 = length // 4
    for i in range(length4):
        i4 = i * 4
        k = data[i4] | (data[i4 + 1] << 8) | (data[i4 + 2] << 16) | (data[i4 + 3] << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    extra = length % 4
    index = length & ~3
    if extra >= 3:
        h ^= data[index + 2] << 16
    if extra >= 2:
        h ^= data[index + 1] << 8
    if extra >= 1:
        h ^= data[index]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


@lru_cache(maxsize=65536)
def partition_for(project_sha256: bytes, partitions: int) -> int:
    """The partition of a project among ``partitions`` (Kafka's ``toPositive(murmur2(key)) % n``).

    Cached: murmur2 in Python costs microseconds and every record of a project asks the same question.
    """
    if partitions < 1:
        raise ValueError("a topic has at least one partition")
    return (murmur2(project_sha256) & 0x7FFFFFFF) % partitions
