"""``KeyFilter``: which keys a set may hold, in a few bytes a key (pure; a Bloom filter).

The keys are hash outputs (``turn_ids``' turn keys: 16 bytes of SHA-256), so their own bits serve as
the filter's hash functions: the first 8 bytes and the next 8 give the two values of double hashing
(Kirsch and Mitzenmacher: position ``i`` is ``h1 + i * h2``). Every key ever added is reported as
maybe present (no false negatives); a key never added is reported present with a small probability
(``false_positive_rate``). The filter grows as a series of filters, each twice the capacity of the
last, so that the rate stays bounded however many keys arrive.

Adding is safe from several threads (a lock); asking needs none, because bits are only ever set.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable

#: Bits a key and positions a key: about 6e-6 false positives a key asked, 4 bytes a key held.
BITS_PER_KEY = 32
HASHES = 8
MIN_KEY_BYTES = 16


class _Bits:
    """One Bloom filter of ``2**log2_bits`` bits for at most ``capacity`` keys."""

    __slots__ = ("bits", "capacity", "count", "mask")

    def __init__(self, capacity: int) -> None:
        log2_bits = max(13, math.ceil(math.log2(max(1, capacity) * BITS_PER_KEY)))
        self.bits = bytearray(1 << (log2_bits - 3))
        self.mask = (1 << log2_bits) - 1
        self.capacity = capacity
        self.count = 0


def _hashes(key: bytes) -> tuple[int, int]:
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"keys are hash outputs of at least {MIN_KEY_BYTES} bytes, not {len(key)}")
    h1 = int.from_bytes(key[:8], "little")
    h2 = int.from_bytes(key[8:16], "little") | 1  # odd: every position differs within a filter
    return h1, h2


class KeyFilter:
    """A growable Bloom filter over keys that are themselves uniformly random (hash outputs)."""

    def __init__(self, capacity: int = 1 << 20) -> None:
        """A filter sized for ``capacity`` keys before it adds a second, larger one."""
        self._filters: list[_Bits] = [_Bits(max(1, capacity))]
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        """Keys added (a key added twice counts twice)."""
        return sum(f.count for f in self._filters)

    @property
    def size_bytes(self) -> int:
        """Bytes the bits take."""
        return sum(len(f.bits) for f in self._filters)

    def add_many(self, keys: Iterable[bytes]) -> None:
        """Add ``keys``; afterwards ``may_contain`` is true for each of them."""
        with self._lock:
            current = self._filters[-1]
            bits, mask = current.bits, current.mask
            for key in keys:
                if current.count >= current.capacity:
                    current = _Bits(2 * current.capacity)
                    self._filters.append(current)
                    bits, mask = current.bits, current.mask
                h1, h2 = _hashes(key)
                for i in range(HASHES):
                    position = (h1 + i * h2) & mask
                    bits[position >> 3] |= 1 << (position & 7)
                current.count += 1

    def add(self, key: bytes) -> None:
        """Add one key."""
        self.add_many((key,))

    def may_contain(self, key: bytes) -> bool:
        """``False`` only when ``key`` was never added."""
        h1, h2 = _hashes(key)
        for f in self._filters:
            bits, mask = f.bits, f.mask
            for i in range(HASHES):
                position = (h1 + i * h2) & mask
                if not bits[position >> 3] & (1 << (position & 7)):
                    break
            else:
                return True
        return False

    def false_positive_rate(self) -> float:
        """The expected chance that a key never added is reported present, at the current fill."""
        miss_all = 1.0
        for f in self._filters:
            m = f.mask + 1
            miss_all *= 1.0 - (1.0 - math.exp(-HASHES * f.count / m)) ** HASHES
        return 1.0 - miss_all

    def __repr__(self) -> str:
        return f"KeyFilter({self.count} keys, {len(self._filters)} filters, {self.size_bytes} bytes)"


__all__ = ["BITS_PER_KEY", "HASHES", "MIN_KEY_BYTES", "KeyFilter"]
