"""What every host's transcript line reader shares: one JSON object a line, its strings and timestamps."""

from __future__ import annotations

import json
from typing import Any

from throughline.core.exceptions import InvalidTurnError
from throughline.core.turn import parse_rfc3339
from throughline.producers.exceptions import TranscriptLineError

__all__ = ["nonempty_str", "timestamp_micros", "transcript_entry"]


def transcript_entry(data: bytes) -> dict[str, Any] | None:
    """The JSON object a transcript line holds; ``None`` for a blank line.

    Raises ``TranscriptLineError`` (code ``invalid_json``) for a line that is not a JSON object: the
    caller reports it and reads on, and the line changes nothing.
    """
    text = data.decode("utf-8", "replace")
    if not text.strip():
        return None
    try:
        entry = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise TranscriptLineError(f"not JSON: {exc}", code="invalid_json") from None
    if not isinstance(entry, dict):
        raise TranscriptLineError("not a JSON object", code="invalid_json")
    return entry


def nonempty_str(value: Any) -> str | None:
    """``value`` when it is a non-empty string, else ``None`` (hosts write ``""`` and ``null`` alike)."""
    return value if isinstance(value, str) and value else None


def timestamp_micros(value: Any) -> int | None:
    """An RFC 3339 timestamp in microseconds since the epoch, or ``None`` when it is not one."""
    try:
        return parse_rfc3339(value)
    except InvalidTurnError:
        return None
