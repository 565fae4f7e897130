"""``throughline serve``: the projector and the HTTP read API in one process (docs/http.md).

- ``app``: the FastAPI application (``create_app``) over a projection, a log view and the token key;
- ``service``: the process: projector thread, uvicorn, signals (``run_service``);
- ``client``: ``HttpReader``, the library's reader over HTTP (a ``PageReader`` for the Observer);
- ``metrics``, ``auth``, ``exceptions``, ``cli``.

This module holds only constants, so that the CLI and the client load without the web stack.
"""

from __future__ import annotations

#: The read endpoint (GET with query parameters, POST with a JSON object).
READ_PATH = "/v1/projects/read"
#: Why a read was ``projection_pending`` or ``resync_required`` (the reader's ``reason``), for a person.
REASON_HEADER = "Throughline-Reason"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8787
#: Longest long-poll a request may ask for; a larger ``wait`` is clamped to it.
DEFAULT_MAX_WAIT = 30.0
#: Bound on the wait for the projector to commit its batch in flight after a stop.
DEFAULT_DRAIN_TIMEOUT = 30.0
