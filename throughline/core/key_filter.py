"""``KeyFilter``: which keys a set may hold, in a few bytes a key (pure; a Bloom filter).

The keys are hash outputs (``turn_ids``' turn keys: 16 bytes of SHA-256), so their own bits serve as
the filter's hash functions: the first 8 bytes and the next 8 give the two values of double hashing
(Kirsch and Mitzenmacher: position ``i`` is ``h1 + i * h2``). Every key ever added is reported as
maybe present (no false negatives); a key never added is reported present with a small probability
(``false_positive_rate``). The filter grows as a series of filters, each twice the capacity of the
last, so that the rate stays bounded however many keys arrive.

Adding is safe from several threads (a lock); asking needs none, because bits are only ever set.

``to_bytes`` and ``from_bytes`` carry a filter between processes (a rebuild's replay hands the filter it
kept to ``serve``, which would otherwise rebuild it key by key in Python): ``FORMAT`` is the byte layout,
version ``FORMAT_VERSION``.
"""

from __future__ import annotations

import math
import struct
import threading
from collections.abc import Iterable

#: Bits a key and positions a key: about 6e-6 false positives a key asked, 4 bytes a key held.
BITS_PER_KEY = 32
HASHES = 8
MIN_KEY_BYTES = 16

#: ``to_bytes``: a header (magic, format version, ``HASHES``, ``BITS_PER_KEY``, the number of filters),
#: then each filter's capacity, keys added and log2 of its bits, followed by its bits; little-endian.
FORMAT = "<4sBBBI then, per filter, <QQB and 2**(log2_bits - 3) bytes"
FORMAT_VERSION = 1
_MAGIC = b"TLKF"
_HEADER = struct.Struct("<4sBBBI")
_FILTER = struct.Struct("<QQB")


def _log2_bits(capacity: int) -> int:
    """Log2 of the bits of a filter for ``capacity`` keys."""
    return max(13, math.ceil(math.log2(max(1, capacity) * BITS_PER_KEY)))


class _Bits:
    """One Bloom filter of ``2**log2_bits`` bits for at most ``capacity`` keys."""

    __slots__ = ("bits", "capacity", "count", "mask")

    def __init__(self, capacity: int) -> None:
        log2_bits = _log2_bits(capacity)
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

    def to_bytes(self) -> bytes:
        """The filter as bytes (``FORMAT``); ``from_bytes`` gives back one that answers the same."""
        with self._lock:
            parts = [_HEADER.pack(_MAGIC, FORMAT_VERSION, HASHES, BITS_PER_KEY, len(self._filters))]
            for f in self._filters:
                parts.append(_FILTER.pack(f.capacity, f.count, f.mask.bit_length()))
                parts.append(bytes(f.bits))
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes) -> KeyFilter:
        """The filter ``to_bytes`` wrote; ``ValueError`` for anything else (another format, version or
        hashing, or bytes cut short or trailing)."""
        view = memoryview(data)
        if len(view) < _HEADER.size:
            raise ValueError("not a key filter: shorter than its header")
        magic, version, hashes, bits_per_key, count = _HEADER.unpack_from(view)
        if magic != _MAGIC:
            raise ValueError("not a key filter: wrong magic")
        if (version, hashes, bits_per_key) != (FORMAT_VERSION, HASHES, BITS_PER_KEY):
            raise ValueError(
                f"a key filter of format {version} ({hashes} hashes, {bits_per_key} bits a key): "
                f"this reads format {FORMAT_VERSION} ({HASHES} hashes, {BITS_PER_KEY} bits a key)"
            )
        if count < 1:
            raise ValueError("a key filter without filters")
        filters: list[_Bits] = []
        at = _HEADER.size
        for _ in range(count):
            if len(view) < at + _FILTER.size:
                raise ValueError("a key filter cut short")
            capacity, added, log2_bits = _FILTER.unpack_from(view, at)
            at += _FILTER.size
            if capacity < 1 or log2_bits != _log2_bits(capacity):  # a filter's size follows from its capacity
                raise ValueError(f"a key filter of {capacity} keys in 2**{log2_bits} bits")
            size = 1 << (log2_bits - 3)
            if len(view) < at + size:
                raise ValueError("a key filter cut short")
            bits = _Bits(capacity)
            bits.bits[:] = view[at : at + size]
            bits.count = added
            filters.append(bits)
            at += size
        if at != len(view):
            raise ValueError(f"a key filter followed by {len(view) - at} more bytes")
        out = cls.__new__(cls)
        out._filters = filters
        out._lock = threading.Lock()
        return out

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


__all__ = ["BITS_PER_KEY", "FORMAT", "FORMAT_VERSION", "HASHES", "MIN_KEY_BYTES", "KeyFilter"]
