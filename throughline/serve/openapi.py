"""The OpenAPI document of ``throughline serve`` (``GET /openapi.json``; committed as docs/openapi.json).

The read routes describe their query parameters and JSON body here, because both are parsed by hand
(``throughline.serve.params``, stricter than a schema: unknown names refused, a query's numbers from
their text). ``ReadRequestBody`` only documents the body's shape; the one value a body becomes is the
reader's ``ReadRequest``. Regenerate the committed file with::

    python -m throughline.serve.app > docs/openapi.json
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from throughline.core.cursor import MAX_CURSOR_CHARS
from throughline.reader.wire import ObserverRead
from throughline.serve import DEFAULT_MAX_WAIT
from throughline.serve.responses import ErrorDocument

# Not empty and without NUL; a name whose canonical form is empty ("a/..") is refused too (400
# invalid_project), which no regular expression states.
PROJECT_PATTERN = "^[^\u0000]+$"
# A cursor's shape: ``tlc<version>.<base64url>`` (a cursor of another version answers resync_required).
# Cursors and page tokens are opaque values this server mints: one of the right shape that it did not
# mint is refused 400 (invalid_cursor, page_token_*), as the read's description says.
CURSOR_PATTERN = r"^tlc[1-9][0-9]{0,3}\.[A-Za-z0-9_-]+$"
CURSOR_SCHEMA: dict[str, Any] = {"type": "string", "maxLength": MAX_CURSOR_CHARS, "pattern": CURSOR_PATTERN}


class ReadRequestBody(BaseModel):
    """The JSON body of ``POST /v1/projects/read`` (documentation of the shape; parsing is stricter)."""

    model_config = ConfigDict(frozen=True, extra="forbid", title="ReadRequest")

    project: str = Field(
        min_length=1,
        pattern=PROJECT_PATTERN,
        description="the project (its canonical form is hashed; never echoed back); not empty, no NUL",
    )
    afterCursor: str | None = Field(
        default=None,
        max_length=MAX_CURSOR_CHARS,
        pattern=CURSOR_PATTERN,
        description="what the Observer already audited; null on first contact",
    )
    throughCursor: str | None = Field(
        default=None,
        max_length=MAX_CURSOR_CHARS,
        pattern=CURSOR_PATTERN,
        description="the series' pinned upper bound (later pages)",
    )
    pageToken: str | None = Field(default=None, description="the previous page's page.nextToken")
    limit: int | None = Field(default=10, ge=1, le=100, description="turns per page, 1..100")
    wait: float | None = Field(
        default=0,
        ge=0,
        description=f"long-poll: seconds to hold an empty answer for new turns (capped at {DEFAULT_MAX_WAIT:g})",
    )


READ_DESCRIPTION = (
    "One page of an Observer read series: the `throughline.observer_read.v1` document, exactly as "
    "`read_observer_turn_page` and `throughline read` return it. `projection_pending` and "
    "`resync_required` are 200 answers; hard input errors are 400 with a stable code. With `wait` > 0, "
    "an empty first page (an empty delta, or a project without turns) is held until the project's "
    "chain moves past the after cursor, at most `wait` seconds. Cursors and page tokens are opaque values "
    "this server minted: a value of the right shape that it did not mint is a 400 (`invalid_cursor`, "
    "`page_token_*`), and so is a project whose canonical form is empty (`a/..`: `invalid_project`)."
)

QUERY_PARAMETERS: list[dict[str, Any]] = [
    {
        "name": "project",
        "in": "query",
        "required": True,
        "schema": {"type": "string", "minLength": 1, "pattern": PROJECT_PATTERN},
        "description": "the project name (canonicalised and hashed; never echoed back)",
    },
    {
        "name": "afterCursor",
        "in": "query",
        "required": False,
        "schema": CURSOR_SCHEMA,
        "description": "what the Observer already audited; omit on first contact. The server also takes "
        "the short alias `after` (not documented as a parameter: give one or the other, never both)",
    },
    {
        "name": "throughCursor",
        "in": "query",
        "required": False,
        "schema": CURSOR_SCHEMA,
        "description": "the pinned through cursor of the series, on its later pages (short alias: `through`, "
        "never with throughCursor)",
    },
    {
        "name": "pageToken",
        "in": "query",
        "required": False,
        "schema": {"type": "string"},
        "description": "`page.nextToken` of the previous page (needs the same afterCursor and throughCursor)",
    },
    {
        "name": "limit",
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 10},
        "description": "turns per page",
    },
    {
        "name": "wait",
        "in": "query",
        "required": False,
        "schema": {"type": "number", "minimum": 0, "default": 0},
        "description": f"long-poll seconds (capped at {DEFAULT_MAX_WAIT:g} by default)",
    },
]

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorDocument, "description": "hard input error (invalid_limit, invalid_cursor, page_token_*, ...)"},
    401: {
        "model": ErrorDocument,
        "description": "missing or refused bearer token (when authentication is on): "
        "unauthorized, token_malformed, token_unknown_key, token_bad_signature, token_wrong_audience, "
        "token_expired (docs/security.md)",
    },
    403: {
        "model": ErrorDocument,
        "description": "the token's scope does not cover the read: forbidden_project "
        "(a project outside a read token's scope, existing or not), forbidden_scope (a metrics token)",
    },
    409: {"model": ErrorDocument, "description": "source_quarantined: the series' source has a quarantined record"},
    413: {"model": ErrorDocument, "description": "request body too large"},
    414: {"model": ErrorDocument, "description": "query string too large"},
    500: {"model": ErrorDocument, "description": "internal failure (no stack trace is returned)"},
    503: {"model": ErrorDocument, "description": "retriable: broker unavailable, projection busy, server_busy"},
}

#: The responses of the read routes: the wire document, or an error document.
READ_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": ObserverRead, "description": "the throughline.observer_read.v1 document"},
    **ERROR_RESPONSES,
}

#: The POST route's body, as the document states it.
READ_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": ReadRequestBody.model_json_schema()}},
    }
}


#: The bearer token: the admin token of ``--auth-token-file`` or a scoped token (docs/security.md).
SECURITY_SCHEMES: dict[str, Any] = {
    "bearerToken": {
        "type": "http",
        "scheme": "bearer",
        "description": "The admin token (`serve --auth-token-file`) or a scoped token (`throughline token "
        "issue`, checked with `serve --token-keys`): scope `read` reads its projects, `metrics` reads "
        "/metrics, `admin` everything. A serve with neither (loopback only) needs no token.",
    }
}
#: The reads and /metrics need the token; /healthz, /readyz and /openapi.json stay open for probes.
SECURED: list[dict[str, list[str]]] = [{"bearerToken": []}]


def openapi_document() -> dict[str, Any]:
    """The API's OpenAPI document (what ``GET /openapi.json`` serves and ``docs/openapi.json`` commits)."""
    from throughline.core.memory import BookProjection, FixedLog
    from throughline.serve.app import create_app  # the document is the app's own: built from its routes

    return create_app(projection=BookProjection(), log=FixedLog(), token_key=bytes(32)).openapi()


def openapi_text() -> str:
    """The committed file's exact text: ``python -m throughline.serve.app > docs/openapi.json``."""
    return json.dumps(openapi_document(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
