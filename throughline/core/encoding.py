"""Small shared encodings for opaque strings (cursors, page tokens)."""

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
