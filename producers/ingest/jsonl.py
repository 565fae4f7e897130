"""One line of an ingest file as a turn: the strict JSON Lines format of ``throughline ingest``.

Input: one turn per line, ``{"project", "host", "thread", "turnId", "completedAt", "body"}``, an
optional ``"seq"`` and an optional ``"attributes"`` (a map of strings to strings: the record's
``producer.attributes``, as ``ingest --dry-run`` prints them). Each line is parsed strictly
(``TurnLine``: no extra keys, no duplicate keys, exact JSON types, ``seq`` an integer and not ``"3"``)
and built with ``build_turn``. Blank lines are skipped.

Attributes are free-form metadata the projector never reads, bounded so a record always fits
(``MAX_ATTRIBUTES`` keys, ``MAX_ATTRIBUTE_KEY_BYTES`` a key, ``MAX_ATTRIBUTES_BYTES`` in all); the keys
throughline itself writes (``RESERVED_ATTRIBUTES``) must hold values of their meaning. A line's own
attributes win over the ones ingest adds (``ingest.line``): a line printed by ``--dry-run`` from a
host transcript keeps the transcript's line, so feeding it back yields the same record.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from throughline.core.exceptions import InvalidTurnError
from throughline.core.turn import MAX_BODY_BYTES, TurnRecord, build_turn, parse_rfc3339
from throughline.producers.exceptions import (
    InvalidAttributesError,
    InvalidLineError,
    InvalidUtf8Error,
    LineJsonError,
    LineTooLongError,
)

#: A line longer than this is rejected without being held in memory. A body at the limit escaped as
#: ``\\uXXXX`` is 6x its bytes at most (control characters), so any valid turn fits.
MAX_LINE_BYTES = 6 * MAX_BODY_BYTES + 64 * 1024


MAX_ATTRIBUTES = 64
MAX_ATTRIBUTE_KEY_BYTES = 256
MAX_ATTRIBUTES_BYTES = 64 * 1024
#: The outcomes a host turn can have (``turn.outcome``).
TURN_OUTCOMES = ("answered", "interrupted", "aborted")
_COUNT = re.compile(r"(0|[1-9][0-9]{0,15})\Z", re.ASCII)
_FORMAT = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}\Z", re.ASCII)


def _positive(value: str) -> bool:
    return bool(_COUNT.match(value)) and value != "0"


#: The attributes throughline writes and what each value must be.
RESERVED_ATTRIBUTES: Mapping[str, tuple[str, Callable[[str], bool]]] = {
    "ingest.format": ("a format name (lower case letters, digits, '.', '_', '-')", lambda v: bool(_FORMAT.match(v))),
    "ingest.line": ("a line number (1 or more, no sign or leading zero)", _positive),
    "ingest.bodyBytes": ("a byte count (no sign or leading zero)", lambda v: bool(_COUNT.match(v))),
    "ingest.bodyTruncated": ('"true"', lambda v: v == "true"),
    "turn.outcome": (" or ".join(TURN_OUTCOMES), lambda v: v in TURN_OUTCOMES),
}


def check_attributes(value: object) -> dict[str, str]:
    """``value`` as producer attributes: a JSON object of strings to strings within the bounds, reserved
    keys holding values of their meaning; ``InvalidAttributesError`` otherwise."""
    if not isinstance(value, dict):
        raise InvalidAttributesError(f"attributes must be an object of strings, not {type(value).__name__}")
    if len(value) > MAX_ATTRIBUTES:
        raise InvalidAttributesError(f"attributes has {len(value)} keys; the limit is {MAX_ATTRIBUTES}")
    total = 0
    for key, item in value.items():
        if not isinstance(item, str):
            raise InvalidAttributesError(f"attributes.{key}: must be a string, not {type(item).__name__}")
        try:
            size, total = len(key.encode("utf-8")), total + len(key.encode("utf-8")) + len(item.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidAttributesError(f"attributes.{key!r}: not valid Unicode text") from None
        if not key or size > MAX_ATTRIBUTE_KEY_BYTES or "\x00" in key:
            raise InvalidAttributesError(
                f"attribute keys are 1..{MAX_ATTRIBUTE_KEY_BYTES} bytes without NUL ({key[:40]!r} is not)"
            )
        rule = RESERVED_ATTRIBUTES.get(key)
        if rule is not None and not rule[1](item):
            raise InvalidAttributesError(f"attributes.{key}: must be {rule[0]}, not {item[:40]!r}")
    if total > MAX_ATTRIBUTES_BYTES:
        raise InvalidAttributesError(f"attributes are {total} bytes; the limit is {MAX_ATTRIBUTES_BYTES}")
    return dict(value)


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
    attributes: dict[str, str] | None = None  # checked first by ``check_attributes`` (its own error code)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise LineJsonError(f"duplicate key {key!r}")
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
    ``InvalidTurnError`` (a field is missing, of the wrong type or invalid), ``InvalidAttributesError``,
    ``BodyTooLargeError`` or ``InvalidProjectError``; every one is an ``InputError`` with a stable
    ``code``. ``attributes`` are the ones ingest adds; the line's own win over them.
    """
    if isinstance(raw, bytes | bytearray):
        if len(raw) > MAX_LINE_BYTES:
            raise LineTooLongError(f"line is {len(raw)} bytes; the limit is {MAX_LINE_BYTES} bytes")
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidUtf8Error(f"line is not UTF-8 (byte {exc.start})") from None
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
        raise LineJsonError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise LineJsonError(f"a line must be a JSON object, not {type(data).__name__}")
    own = data.get("attributes")
    own = None if own is None else check_attributes(own)
    try:
        line = TurnLine.model_validate(data)
    except ValidationError as exc:
        raise InvalidTurnError(field_errors(exc)) from None
    if own is not None:
        attributes = {**(attributes or {}), **own}
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
