"""Cursor helpers every tier's assertions use."""

from __future__ import annotations

from throughline.core.cursor import Cursor, decode_cursor


def cursor_length(cursor: str | None) -> int:
    """The chain length a cursor names (the cursor must be a real one, not ``None`` or a sentinel)."""
    decoded = decode_cursor(cursor)
    assert isinstance(decoded, Cursor), cursor
    return decoded.length
