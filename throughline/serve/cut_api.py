"""Projection snapshots over HTTP (docs/operations.md "Projection snapshots", docs/scale-out.md
"Bootstrapping a new serve"): the admin endpoint that hands one out, and ``serve --bootstrap-from URL``,
which fetches one before a new ``serve`` opens its file.

``GET /v1/admin/snapshot[?partitions=0,2]`` answers ``application/x-tar``: ``manifest.json`` and one
Parquet file per table, flat, as ``throughline snapshot`` writes them. Only the admin may take one (the
bearer token of ``--auth-token-file``, or a scoped token of scope ``admin``): it holds every project of
those partitions. The snapshot is written to a temporary directory beside the projection file (same disk:
room for the snapshot twice, the files and the tar, for the time of the request), removed once sent.

Named "cut" in code, never "snapshot" alone: that is a read's snapshot inside the store.
"""

from __future__ import annotations

import http.client
import logging
import os
import shutil
import ssl
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from throughline.errors import ThroughlineError
from throughline.serve.auth import BearerAuth
from throughline.serve.exceptions import ForbiddenError, InvalidBootstrapUrlError, SnapshotFetchError

if TYPE_CHECKING:
    from throughline.log import KafkaClientConfig
    from throughline.projector.member_boot import CutFetcher
    from throughline.projector.store import DuckProjection

_log = logging.getLogger("throughline.serve")

SNAPSHOT_PATH = "/v1/admin/snapshot"
TAR_TYPE = "application/x-tar"
#: ``serve --bootstrap-from`` sends this token when set, else the serve's own ``--auth-token-file`` token.
ENV_BOOTSTRAP_TOKEN = "THROUGHLINE_BOOTSTRAP_TOKEN"
#: Bounds of a fetch: each socket operation, and the whole download.
FETCH_SOCKET_TIMEOUT = 60.0
FETCH_DEADLINE = 6 * 3600.0
#: A group member's download of one partition's snapshot (on a worker thread; the member polls on).
#: Guess, stated in docs/scale-out.md: an hour is ~350 GB at 100 MB/s, far beyond one partition's
#: projection; a holder slower than that is given up and the next member asked.
MEMBER_FETCH_DEADLINE = 3600.0
_CHUNK = 1 << 20
#: The loop's count bound (a read returns what one receive brought, up to ``_CHUNK``); time bounds it first.
_MAX_CHUNKS = 1 << 30


def install_cut_route(app: FastAPI, current: Callable[[], DuckProjection], auth: BearerAuth) -> None:
    """Add ``GET /v1/admin/snapshot`` to ``app``, a snapshot of the projection ``current()`` names at each
    request (left out of the OpenAPI document: an operator's endpoint, described in docs/operations.md)."""
    from throughline.projector.cut_load import remove_tree, take_cut
    from throughline.projector.cut_manifest import parse_partitions

    def build(partitions: Sequence[int] | None) -> tuple[Path, Path]:
        projection = current()
        work = Path(tempfile.mkdtemp(prefix=f".{projection.path.name}.snapshot-", dir=projection.path.parent))
        try:
            cut = work / "cut"
            take_cut(projection, cut, partitions)
            tar_path = work / "snapshot.tar"
            with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
                for child in sorted(cut.iterdir()):
                    tar.add(child, arcname=child.name, recursive=False)
            shutil.rmtree(cut)
            return work, tar_path
        except BaseException:
            remove_tree(work)
            raise

    @app.get(SNAPSHOT_PATH, include_in_schema=False)
    async def snapshot(request: Request) -> FileResponse:
        grant = auth.check(request.headers.get("authorization"))
        if grant.scope != "admin":
            raise ForbiddenError("a projection snapshot holds every project of its partitions: only admin takes one")
        partitions = parse_partitions(request.query_params.get("partitions"))
        work, tar_path = await run_in_threadpool(build, partitions)
        return FileResponse(
            tar_path,
            media_type=TAR_TYPE,
            filename="throughline-snapshot.tar",
            headers={"Cache-Control": "no-store"},
            background=BackgroundTask(remove_tree, work),
        )


def snapshot_url(url: str) -> str:
    """The snapshot URL of ``--bootstrap-from``: a serve's base URL gets ``/v1/admin/snapshot``; a URL with
    a path (e.g. ``.../v1/admin/snapshot?partitions=0,1``) is taken as it is."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.fragment or not url.isascii():
        raise InvalidBootstrapUrlError(f"--bootstrap-from must be an http(s) URL of a serve, got {url!r}")
    if parts.path in ("", "/"):
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, SNAPSHOT_PATH, parts.query, ""))
    return url


def fetch_cut(
    url: str,
    target: Path,
    *,
    token: str | None,
    context: ssl.SSLContext | None,
    deadline: float = FETCH_DEADLINE,
    cancel: threading.Event | None = None,
) -> None:
    """Download a snapshot tar from ``url`` into ``target`` (``SnapshotFetchError`` when it cannot, when it
    takes longer than ``deadline`` seconds, or once ``cancel`` is set: both checked after every receive,
    each socket operation bounded by ``FETCH_SOCKET_TIMEOUT``)."""
    headers = {"Accept": TAR_TYPE}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, headers=headers, method="GET")
    until = time.monotonic() + deadline
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(request, timeout=FETCH_SOCKET_TIMEOUT) as response, open(target, "wb") as out:
            expected = response.headers.get("Content-Length")
            size = 0
            for _ in range(_MAX_CHUNKS):
                # What one receive brought: the deadline and ``cancel`` are checked after each, so a
                # holder trickling bytes cannot stretch one read past them.
                chunk = response.read1(_CHUNK)
                if not chunk:
                    break
                out.write(chunk)
                size += len(chunk)
                if time.monotonic() > until:
                    raise SnapshotFetchError(f"the snapshot from {url} took longer than {deadline:g}s")
                if cancel is not None and cancel.is_set():
                    raise SnapshotFetchError(f"the download of the snapshot from {url} was cancelled")
            if expected is not None and expected.isdigit() and int(expected) != size:
                raise SnapshotFetchError(f"the snapshot from {url} was cut short ({size} of {expected} bytes)")
    except urllib.error.HTTPError as exc:
        with exc:
            body = exc.read(4096).decode("utf-8", "replace")
        raise SnapshotFetchError(f"{url} answered HTTP {exc.code}: {body}") from None
    except (OSError, ValueError, http.client.HTTPException) as exc:  # URLError, a reset, a timeout, a cut answer
        raise SnapshotFetchError(f"cannot fetch a snapshot from {url}: {exc}") from None


def unpack_cut(tar_path: Path, out_dir: Path) -> None:
    """Extract a snapshot tar: regular files at its top level only (anything else, or a tar that does not
    read, is ``SnapshotDamagedError``)."""
    from throughline.projector.exceptions import SnapshotDamagedError

    out_dir.mkdir()
    try:
        with tarfile.open(tar_path, "r:") as tar:
            for member in tar.getmembers():
                if not member.isfile() or "/" in member.name or member.name in ("", ".", ".."):
                    raise SnapshotDamagedError(f"the snapshot tar holds {member.name!r}, not a flat file")
                tar.extract(member, out_dir, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise SnapshotDamagedError(f"the snapshot tar does not read: {exc}") from None


def bootstrap_from(
    url: str,
    db: Path,
    *,
    bootstrap_servers: Sequence[str],
    topic: str,
    kafka_config: KafkaClientConfig | None,
    token: str | None,
    context: ssl.SSLContext | None,
) -> bool:
    """``serve --bootstrap-from URL``: build the new file ``db`` from a peer's snapshot before ``serve`` opens
    it. Returns whether it did. ``db`` already there: nothing is fetched (a restarted ``serve`` keeps its
    file). A snapshot that cannot be fetched or is refused (``projection_snapshot_*``) is logged with its
    code and ``serve`` goes on with a new file, caught up from the log from offset 0."""
    from throughline.projector.cut_load import load_cut_into, remove_tree
    from throughline.projector.store import wal_path

    target = snapshot_url(url)
    if db.exists() or wal_path(db).exists():
        _log.info("--bootstrap-from: %s exists, so it is used as it is (nothing fetched)", db)
        return False
    db.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{db.name}.bootstrap-", dir=db.parent))
    started = time.monotonic()
    try:
        tar_path = work / "snapshot.tar"
        fetch_cut(target, tar_path, token=token, context=context)
        unpack_cut(tar_path, work / "cut")
        tar_path.unlink()
        manifest = load_cut_into(
            work / "cut", db, bootstrap_servers=bootstrap_servers, topic=topic, kafka_config=kafka_config
        )
    except ThroughlineError as exc:
        _log.warning(
            "--bootstrap-from %s refused (%s: %s): catching up from the log from offset 0 instead",
            target,
            exc.code,
            exc.message,
        )
        return False
    finally:
        remove_tree(work)
    _log.warning(
        "--bootstrap-from %s: loaded partitions %s at offsets %s in %.1fs; catching up from there",
        target,
        list(manifest.partitions),
        manifest.next_offsets(),
        time.monotonic() - started,
    )
    return True


def bootstrap_token(auth_token: str | None) -> str | None:
    """The token ``--bootstrap-from`` sends: ``THROUGHLINE_BOOTSTRAP_TOKEN``, else the serve's own."""
    return os.environ.get(ENV_BOOTSTRAP_TOKEN) or auth_token


def peer_cut_fetcher(token: str | None, context: ssl.SSLContext | None) -> CutFetcher:
    """A group member's ``CutFetcher`` (``throughline.projector.member_boot``): a peer's snapshot of some
    partitions from its ``/v1/admin/snapshot``, with the token and TLS context of ``--bootstrap-from``
    (``bootstrap_token``), downloaded beside ``out_dir`` (within ``MEMBER_FETCH_DEADLINE``, until
    ``cancel``) and unpacked into it."""

    def fetch(holder: str, partitions: Sequence[int], out_dir: Path, cancel: threading.Event) -> None:
        base = snapshot_url(holder.rstrip("/") + "/")
        # Commas as they are (the form docs/operations.md shows): the list is digits and commas only.
        query = urllib.parse.urlencode({"partitions": ",".join(str(p) for p in partitions)}, safe=",")
        tar_path = out_dir.with_name(out_dir.name + ".tar")
        try:
            fetch_cut(
                f"{base}?{query}",
                tar_path,
                token=token,
                context=context,
                deadline=MEMBER_FETCH_DEADLINE,
                cancel=cancel,
            )
            unpack_cut(tar_path, out_dir)
        finally:
            tar_path.unlink(missing_ok=True)

    return fetch
