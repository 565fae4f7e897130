"""Cursors: opaque, versioned names of a prefix of one source's chain.

A cursor string is ``"tlc1." + base64url(payload)`` where the 116-byte payload is::

    project_sha256 (32) || source_sha256 (32) || length (u64be) || chain_digest (32)
    || partition (u32be) || offset (u64be)

``(partition, offset)`` is the log position of the record that made this prefix (the turn at
``seq == length``). A cursor holds hashes and numbers only: no project path, host, thread or text.

Decoding distinguishes two failures, because the contract treats them differently:

- a string that is not a cursor at all raises ``InvalidCursorError`` (a hard input error);
- a well-formed cursor of another version (``tlc2.``...) decodes to ``ForeignCursor``, which the reader
  answers with ``resync_required``.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from throughline.core.encoding import b64url_decode, b64url_encode
from throughline.core.exceptions import InvalidCursorError

CURSOR_VERSION = 1
MAX_CURSOR_CHARS = 1024
_PREFIX = f"tlc{CURSOR_VERSION}."
_LAYOUT = struct.Struct(">32s32sQ32sIQ")
# ``\Z``, not ``$`` (which also matches before a trailing newline), and no leading zero in the version:
# each cursor has exactly one spelling.
_SHAPE = re.compile(r"^tlc([1-9][0-9]{0,3})\.([A-Za-z0-9_-]+)\Z")
_MAX_U63 = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Cursor:
    """A prefix of one source's chain, and where in the log it was made."""

    project_sha256: bytes
    source_sha256: bytes
    length: int
    chain_digest: bytes
    partition: int
    offset: int

    def __post_init__(self) -> None:
        if len(self.project_sha256) != 32 or len(self.source_sha256) != 32 or len(self.chain_digest) != 32:
            raise ValueError("cursor hashes are 32 bytes")
        if not 1 <= self.length <= _MAX_U63 or not 0 <= self.partition < 2**31 or not 0 <= self.offset <= _MAX_U63:
            raise ValueError("cursor numbers out of range")

    def encode(self) -> str:
        """The opaque cursor string."""
        payload = _LAYOUT.pack(
            self.project_sha256, self.source_sha256, self.length, self.chain_digest, self.partition, self.offset
        )
        return _PREFIX + b64url_encode(payload)


@dataclass(frozen=True, slots=True)
class ForeignCursor:
    """A well-formed cursor of a version this reader does not speak (answered with resync_required)."""

    version: int
    text: str


def decode_cursor(text: object, *, field: str = "cursor") -> Cursor | ForeignCursor:
    """Decode a cursor string; raise ``InvalidCursorError`` when it is not one."""
    if not isinstance(text, str):
        raise InvalidCursorError(f"{field} must be a string")
    if len(text) > MAX_CURSOR_CHARS:
        raise InvalidCursorError(f"{field} is longer than {MAX_CURSOR_CHARS} characters")
    m = _SHAPE.match(text)
    if not m:
        raise InvalidCursorError(f"{field} is not a throughline cursor")
    version = int(m.group(1))
    if version != CURSOR_VERSION:
        return ForeignCursor(version, text)
    payload = b64url_decode(m.group(2))
    if payload is None or len(payload) != _LAYOUT.size:
        raise InvalidCursorError(f"{field} is not a throughline cursor")
    project, source, length, digest, partition, offset = _LAYOUT.unpack(payload)
    try:
        return Cursor(project, source, length, digest, partition, offset)
    except ValueError:
        raise InvalidCursorError(f"{field} is not a throughline cursor") from None
