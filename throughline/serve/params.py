"""The read endpoint's wire -> ``ReadRequest``: query parameters (GET) or a JSON object (POST).

The one place the HTTP wire becomes the reader's ``ReadRequest`` (``throughline.reader.request``). The
wire's own rules live here: the names (camelCase, with the short aliases ``after`` and ``through``),
unknown or repeated names refused, a query's ``limit`` and ``wait`` parsed from their text, a long-poll
``wait`` clamped to the server's cap. The values' rules (``limit`` 1..100, finite seconds) are the
``ReadRequest``'s; the texts are checked by the reader, in its order of checks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from throughline.reader.exceptions import InvalidWaitError
from throughline.reader.request import ReadRequest, require_seconds
from throughline.serve import DEFAULT_MAX_WAIT
from throughline.serve.exceptions import InvalidRequestError

_INTEGER = re.compile(r"^[+-]?[0-9]{1,20}\Z")
_SECONDS = re.compile(r"^[0-9]{1,6}(\.[0-9]{1,9})?\Z")

#: The wire's names, each to its ``ReadRequest`` field.
FIELD_OF = {
    "project": "project",
    "afterCursor": "after_cursor",
    "after": "after_cursor",
    "throughCursor": "through_cursor",
    "through": "through_cursor",
    "pageToken": "page_token",
    "limit": "limit",
    "wait": "wait",
}


def _quoted(name: str) -> str:
    return repr(name if len(name) <= 64 else name[:64] + "...")


def _collect(pairs: Iterable[tuple[str, object]]) -> dict[str, object]:
    # Unknown names are refused, not ignored: a misspelt ``afterCursor`` silently read as first contact
    # would hand the Observer a snapshot instead of the delta it asked for.
    out: dict[str, object] = {}
    for name, value in pairs:
        field = FIELD_OF.get(name)
        if field is None:
            raise InvalidRequestError(
                f"unknown parameter {_quoted(name)}; expected project, afterCursor, throughCursor, pageToken, "
                "limit, wait"
            )
        if field in out:
            raise InvalidRequestError(f"parameter {_quoted(name)} is given more than once")
        out[field] = value
    return out


def _request(values: Mapping[str, Any], wait: float) -> ReadRequest:
    if values.get("project") is None:
        raise InvalidRequestError("project is required")
    # JSON values keep their JSON types (``Any``): the reader refuses a non-text project or cursor with
    # its own code, in its order of checks.
    return ReadRequest(
        project=values["project"],
        after_cursor=values.get("after_cursor"),
        through_cursor=values.get("through_cursor"),
        page_token=values.get("page_token"),
        limit=values.get("limit"),
        wait=wait,
    )


def request_from_query(pairs: Iterable[tuple[str, str]], *, max_wait: float = DEFAULT_MAX_WAIT) -> ReadRequest:
    """A read request from query parameters (strings): ``limit`` and ``wait`` are parsed as numbers."""
    values = _collect(pairs)
    limit = values.get("limit")
    if isinstance(limit, str) and _INTEGER.match(limit):
        values["limit"] = int(limit)  # anything else stays a string, which validate_limit refuses
    wait = 0.0
    raw_wait = values.get("wait")
    if raw_wait is not None:
        if not isinstance(raw_wait, str) or not _SECONDS.match(raw_wait):
            raise InvalidWaitError(f"wait must be a number of seconds >= 0, got {_quoted(str(raw_wait))}")
        wait = min(float(raw_wait), max_wait)  # a longer wait is clamped, not refused
    return _request(values, wait)


def request_from_json(body: bytes, *, max_wait: float = DEFAULT_MAX_WAIT) -> ReadRequest:
    """A read request from a JSON object; values keep their JSON types (the reader checks them)."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # a deeply nested body is bad input, not a crash
        raise InvalidRequestError("the request body is not JSON") from None
    if not isinstance(document, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    values = _collect(document.items())
    wait = 0.0
    raw_wait = values.get("wait")
    if raw_wait is not None:
        wait = min(require_seconds(raw_wait, "wait"), max_wait)  # JSON: a number, not text; clamped
    return _request(values, wait)
