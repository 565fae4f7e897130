"""Content and chain digests of completed turns.

Canonical form of a turn's content (version 1), the input of ``content_digest``::

    b"throughline.turn.v1\\x00"
    || u64be(len(turn_id_utf8))  || turn_id_utf8
    || i64be(completed_at as microseconds since the Unix epoch, UTC)
    || u64be(len(body_utf8))     || body_utf8

Every variable-length field is length-prefixed, so no two different turns share a canonical form.
The source (project, host, thread) is not part of the content: a chain belongs to one source, and its
identity travels beside the digest in every cursor.

Chain digest: ``d(0) = SHA-256(b"throughline.chain.v1")`` (fixed) and
``d(n) = SHA-256(d(n-1) || content_digest(n))`` over the raw 32-byte values. A cursor carrying
``(length, d(length))`` therefore proves which prefix of a chain it names.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from datetime import UTC, datetime

_TURN_DOMAIN = b"throughline.turn.v1\x00"
CHAIN_ORIGIN: bytes = hashlib.sha256(b"throughline.chain.v1").digest()
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def micros_since_epoch(moment: datetime) -> int:
    """Whole microseconds since the Unix epoch of an aware datetime."""
    if moment.tzinfo is None:
        raise ValueError("completed_at must carry a time zone")
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def content_digest(turn_id: str, completed_at_micros: int, body: str) -> bytes:
    """SHA-256 over the canonical content form of one turn (32 raw bytes)."""
    return content_digest_utf8(turn_id, completed_at_micros, body.encode("utf-8"))


def content_digest_utf8(turn_id: str, completed_at_micros: int, text: bytes) -> bytes:
    """``content_digest`` for a body already encoded as UTF-8 (saves encoding a large body twice)."""
    tid = turn_id.encode("utf-8")
    h = hashlib.sha256(_TURN_DOMAIN)
    h.update(len(tid).to_bytes(8, "big"))
    h.update(tid)
    h.update(completed_at_micros.to_bytes(8, "big", signed=True))
    h.update(len(text).to_bytes(8, "big"))
    h.update(text)
    return h.digest()


def next_chain_digest(previous: bytes, content: bytes) -> bytes:
    """``d(n) = SHA-256(d(n-1) || content_digest(n))``."""
    if len(previous) != 32 or len(content) != 32:
        raise ValueError("digests are 32 bytes")
    return hashlib.sha256(previous + content).digest()


def chain_digests(contents: Iterable[bytes], start: bytes = CHAIN_ORIGIN) -> list[bytes]:
    """The chain digests d(1..n) of a sequence of content digests, starting after ``start``."""
    out: list[bytes] = []
    current = start
    for content in contents:
        current = next_chain_digest(current, content)
        out.append(current)
    return out
