"""The reader: pinned, token-bound pages of completed turns for an auditing Observer (docs/spec.md#read-contract).

- ``read_observer_turn_page``: one page of a read series over a projection and the log; ``read_page``
  the same over a ``ReadRequest``, the one request value the library, the CLI and the HTTP API share.
- ``ObserverRead`` and its parts: the read wire ``throughline.observer_read.v1``.
- ``resolve_token_key``: the page-token key (configuration, or a file kept beside the projection).
- ``Observer``: the reference Observer, which saves its cursor only after a whole audited series.

Its modules, one concern each:

- ``page``: one page of a read series (``read_observer_turn_page``, ``read_page``);
- ``request``: ``ReadRequest``, one page as the library, ``throughline read`` and ``serve`` take it;
- ``wire``: the read wire (``ObserverRead`` and its parts) as pydantic models;
- ``token_key``: the page-token key;
- ``observer``: the reference Observer;
- ``local``: pages read in this process from the projection file and the log (``open_page_reader``);
- ``exceptions``: errors of the reader, the token key and the Observer.
"""

from __future__ import annotations

from throughline.reader.exceptions import (
    AuditFailedError,
    InvalidBodyLimitError,
    InvalidWaitError,
    ObserverInterrupted,
    ObserverProtocolError,
    ObserverStateError,
    ObserverStateWriteError,
    PageTokenUnboundError,
    ProjectionPendingError,
    ResyncRequiredError,
    SourceQuarantinedError,
    TokenKeyError,
)
from throughline.reader.observer import (
    OBSERVER_STATE_SCHEMA,
    Observer,
    PageReader,
    SeriesOutcome,
    SeriesSummary,
    load_observer_state,
    save_observer_state,
)
from throughline.reader.page import (
    DEFAULT_BODY_LIMIT,
    DEFAULT_WAIT_TIMEOUT,
    cut_body,
    read_observer_turn_page,
    read_page,
)
from throughline.reader.request import ReadRequest
from throughline.reader.token_key import (
    ENV_TOKEN_KEY,
    ENV_TOKEN_KEY_FILE,
    KEY_FILE_NAME,
    default_key_path,
    load_or_create_key,
    parse_token_key,
    resolve_token_key,
)
from throughline.reader.wire import (
    SCHEMA,
    STATUS_OK,
    STATUS_PENDING,
    STATUS_RESYNC,
    ObserverRead,
    PageWire,
    ThreadIdentity,
    TurnRecordWire,
    json_schema,
)

__all__ = [
    "DEFAULT_BODY_LIMIT",
    "DEFAULT_WAIT_TIMEOUT",
    "ENV_TOKEN_KEY",
    "ENV_TOKEN_KEY_FILE",
    "KEY_FILE_NAME",
    "SCHEMA",
    "OBSERVER_STATE_SCHEMA",
    "STATUS_OK",
    "STATUS_PENDING",
    "STATUS_RESYNC",
    "AuditFailedError",
    "InvalidBodyLimitError",
    "InvalidWaitError",
    "Observer",
    "ObserverInterrupted",
    "ObserverProtocolError",
    "ObserverRead",
    "ObserverStateError",
    "ObserverStateWriteError",
    "PageReader",
    "PageTokenUnboundError",
    "PageWire",
    "ProjectionPendingError",
    "ReadRequest",
    "ResyncRequiredError",
    "SeriesOutcome",
    "SeriesSummary",
    "SourceQuarantinedError",
    "ThreadIdentity",
    "TokenKeyError",
    "TurnRecordWire",
    "cut_body",
    "default_key_path",
    "json_schema",
    "load_or_create_key",
    "load_observer_state",
    "parse_token_key",
    "read_observer_turn_page",
    "read_page",
    "resolve_token_key",
    "save_observer_state",
]
