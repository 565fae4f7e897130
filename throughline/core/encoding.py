"""Small shared encodings: opaque strings (cursors, page tokens) and zig-zag varints (Avro longs, the
varints of Kafka's v2 records: one encoding)."""

from __future__ import annotations

import base64
import binascii
import re

_B64URL = re.compile(r"^[A-Za-z0-9_-]*$")


def b64url_encode(data: bytes) -> str:
    """URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes | None:
    """Strict inverse of ``b64url_encode``: ``None`` unless ``text`` is its exact output for some bytes."""
    if not _B64URL.match(text) or len(text) % 4 == 1:
        return None
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    # Reject non-canonical encodings (stray bits in the last character) so each value has one spelling.
    return data if b64url_encode(data) == text else None


#: Bytes of the longest varint of a 64-bit value (7 bits a byte; the tenth holds bit 63 only).
MAX_VARINT_BYTES = 10


def read_zigzag(buf: bytes, p: int) -> tuple[int, int]:
    """The zig-zag varint at ``p`` of ``buf``: its value and the position after it.

    An Avro long and a Kafka varlong are 64-bit: a varint of more than ten bytes, or a tenth byte
    holding more than bit 63, is not one and raises ``ValueError`` (docs/design.md, "Varints"), so
    the value is always a signed 64-bit integer. Raises ``IndexError`` when ``buf`` ends inside it.
    """
    b = buf[p]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), p + 1
    result = b & 0x7F
    shift = 7
    while True:
        p += 1
        b = buf[p]
        result |= (b & 0x7F) << shift
        if b < 0x80:
            # Only a tenth byte (shift 63) can carry bits past 64; Java's Avro and Kafka would
            # silently drop them (and fastavro's C reader wraps the value modulo 2**64).
            if result >> 64:  # mutant-anchor: varint-wide
                raise ValueError(f"a varint whose value runs past 64 bits (ending at byte {p})")
            return (result >> 1) ^ -(result & 1), p + 1
        shift += 7
        if shift > 63:
            raise ValueError(f"a varint longer than {MAX_VARINT_BYTES} bytes (64 bits) at byte {p}")
