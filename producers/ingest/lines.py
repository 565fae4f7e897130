"""One line of an ingest file as a turn: the strict JSON Lines format of ``throughline ingest``.

Input: one turn per line, ``{"project", "host", "thread", "turnId", "completedAt", "body"}`` and an
optional ``"seq"``. Each line is parsed strictly (``TurnLine``: no extra keys, no duplicate keys, exact
JSON types, ``seq`` an integer and not ``"3"``) and built with ``build_turn``. Blank lines are skipped.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from throughline.core.exceptions import InvalidTurnError
from throughline.core.turn import MAX_BODY_BYTES, TurnRecord, build_turn, parse_rfc3339
from throughline.producers.exceptions import InvalidLineError

#: A line longer than this is rejected without being held in memory. A body at the limit escaped as
#: ``\\uXXXX`` is 6x its bytes at most (control characters), so any valid turn fits.
MAX_LINE_BYTES = 6 * MAX_BODY_BYTES + 64 * 1024


class TurnLine(BaseModel):
    """One line of an ingest file (strict: exact JSON types, no other keys)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    project: str
    host: str
    thread: str
    turn_id: str = Field(alias="turnId")
    completed_at: str = Field(alias="completedAt")
    body: str
    seq: int | None = None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise InvalidLineError(f"duplicate key {key!r}", code="invalid_json")
        out[key] = value
    return out


def field_errors(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_input=False, include_url=False)[:4]:
        where = ".".join(str(p) for p in err["loc"]) or "line"
        parts.append(f"{where}: {err['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def parse_turn_line(
    raw: bytes | str,
    *,
    producer_name: str = "throughline-ingest",
    producer_version: str = "0",
    produced_at_micros: int = 0,
    attributes: dict[str, str] | None = None,
) -> TurnRecord | None:
    """Parse one JSON Lines line into a validated turn; ``None`` for a blank line.

    Raises ``InvalidLineError`` (``invalid_utf8``, ``invalid_json``, ``line_too_long``),
    ``InvalidTurnError`` (a field is missing, of the wrong type or invalid), ``BodyTooLargeError`` or
    ``InvalidProjectError``; every one is an ``InputError`` with a stable ``code``.
    """
    if isinstance(raw, bytes | bytearray):
        if len(raw) > MAX_LINE_BYTES:
            raise InvalidLineError(f"line is {len(raw)} bytes; the limit is {MAX_LINE_BYTES} bytes", code="line_too_long")
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidLineError(f"line is not UTF-8 (byte {exc.start})", code="invalid_utf8") from None
    else:
        text = raw
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text.strip():
        return None
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except InvalidLineError:
        raise
    except (ValueError, RecursionError) as exc:
        raise InvalidLineError(f"not JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise InvalidLineError(f"a line must be a JSON object, not {type(data).__name__}", code="invalid_json")
    try:
        line = TurnLine.model_validate(data)
    except ValidationError as exc:
        raise InvalidTurnError(field_errors(exc)) from None
    return build_turn(
        project=line.project,
        host=line.host,
        thread=line.thread,
        turn_id=line.turn_id,
        completed_at_micros=parse_rfc3339(line.completed_at),
        body=line.body,
        seq=line.seq,
        producer_name=producer_name,
        producer_version=producer_version,
        produced_at_micros=produced_at_micros,
        attributes=attributes,
    )
