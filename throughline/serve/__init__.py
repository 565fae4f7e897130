"""``throughline serve``: the projector and the HTTP read API in one process (docs/http.md).

Its modules, one concern each:

- ``service``: the process: projector thread, uvicorn, signals (``run_service``; its options are
  ``throughline.commands.serve``'s); ``projector_runs``: the projector runs it starts (live, group member,
  rebuild) and the progress callback that counts them into ``/metrics``;
- ``app``: the FastAPI application (``create_app``) over a projection, a log view and the token key;
- ``read_route``: the read endpoint as a plain ASGI handler, ahead of FastAPI's router;
- ``read_api``: ``ReadApi``, what the routes do, without HTTP;
- ``params``: the read endpoint's query parameters or JSON object as a ``ReadRequest``;
- ``responses``: the documents the API answers, and which HTTP status an error gets;
- ``guard``: ``RequestGuard``, the ASGI layer in front of the routes (size limits, a count of answers);
- ``http_protocol``: the HTTP/1.1 parser uvicorn runs with (httptools, else h11);
- ``metrics``: a small metrics registry in the Prometheus text format;
- ``openapi``: the OpenAPI document (``GET /openapi.json``);
- ``auth``: bearer-token authentication; ``tokens``: scoped read tokens, signed and self-contained;
- ``security``: HTTPS and token-key upkeep;
- ``rebuild``: rebuilding the projection without downtime (``Rebuild``); ``pausable``: the live projector
  a rebuild pauses and hands a new run (``PausableProjector``, ``RunThread``);
  ``switchable``: ``SwitchableProjection``, the read facade a rebuild switches files under;
  ``admin_rebuild``: its admin endpoint (``/v1/admin/rebuild``);
- ``group``: the read side of a ``serve --group`` member; ``forward``: a read passed on to its member;
- ``client``: ``HttpReader``, the library's reader over HTTP (a ``PageReader`` for the Observer);
- ``transport``: one HTTP request to a server, and the same request along a group's members;
- ``cut_api``: projection snapshots over HTTP (``GET /v1/admin/snapshot``, ``serve --bootstrap-from``);
- ``remote_status``: the readiness of running servers as ``throughline status --url`` shows it;
- ``exceptions``: errors of the server and of its client.

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
