"""The admin endpoint of a rebuild without downtime (``throughline.serve.rebuild``):

- ``POST /v1/admin/rebuild``: start one (202 with its status; 409 ``rebuild_refused`` while one runs,
  after this serve switched files already, or in a serve that cannot rebuild);
- ``GET /v1/admin/rebuild``: its phase and figures (``RebuildStatus.to_json``).

Both need the admin token (``--auth-token-file``: the ``admin`` grant); a scoped read or metrics token is
refused with 403 ``forbidden_scope``. On a loopback serve without tokens every request is the admin,
as for every other endpoint (``BearerAuth``).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from throughline.serve.auth import BearerAuth
from throughline.serve.exceptions import ForbiddenError, RebuildRefusedError

REBUILD_PATH = "/v1/admin/rebuild"


def install_rebuild_routes(app: FastAPI, auth: BearerAuth, rebuild: Any | None) -> None:
    """Add the rebuild endpoint to ``app``; ``rebuild`` is the service's ``Rebuild`` (``None``: this serve
    cannot rebuild: ``--no-projector`` or ``--group``)."""

    def require_admin(request: Request) -> None:
        if auth.check(request.headers.get("authorization")).scope != "admin":
            raise ForbiddenError("rebuilding the projection needs the admin token")

    def available() -> Any:
        if rebuild is None:
            raise RebuildRefusedError("this serve cannot rebuild its projection (--no-projector or --group)")
        return rebuild

    # Out of the OpenAPI document (docs/openapi.json is the read API's contract); docs/http.md describes it.
    @app.post(REBUILD_PATH, summary="Rebuild the projection without downtime", include_in_schema=False)
    async def start_rebuild(request: Request) -> JSONResponse:
        require_admin(request)
        status = available().start()
        return JSONResponse(status.to_json(), status_code=202, headers={"Cache-Control": "no-store"})

    @app.get(REBUILD_PATH, summary="The rebuild's phase and progress", include_in_schema=False)
    async def rebuild_status(request: Request) -> JSONResponse:
        require_admin(request)
        return JSONResponse(available().status().to_json(), headers={"Cache-Control": "no-store"})
