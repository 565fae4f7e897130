"""``throughline serve``: the projector and the HTTP read API in one process.

DuckDB lets one process write a database file, so the projector and the reader share one
``DuckProjection``: the projector applies batches on its own thread, and request threads read
snapshots of the same handle and wake on its commit notifications (``wait_applied``).

Lifecycle:

1. Resolve the page-token key, bind the listening socket (``--port 0`` picks a free port), make sure the
   topic exists (created to keep every record, as the producers do), open the projection and the log
   view; start the projector thread.
2. Serve HTTP (uvicorn) on the main thread; announce the URL once requests are accepted (the command prints it on stdout).
3. On SIGTERM or SIGINT: stop accepting connections, release waiting long-polls, let requests in flight
   finish (bounded), let the projector finish and commit the batch in flight (bounded by
   ``--drain-timeout``), close everything, exit 0. A second signal stops without waiting for the
   projector (the projection stays consistent: a batch is one transaction, applied again next start).
4. A retriable projector failure (the broker went away) is retried with a backoff while the service
   answers reads and reports itself not ready. Any other failure, or one that lasts longer than the
   retry window, stops the service the same way, and it exits 1 with the projector's error, so that a
   supervisor restarts it or an operator sees why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

from throughline.errors import ThroughlineError
from throughline.runtime import StopOnSignals
from throughline.serve import DEFAULT_DRAIN_TIMEOUT, DEFAULT_HOST, DEFAULT_PORT
from throughline.serve.admin_rebuild import install_rebuild_routes
from throughline.serve.app import ApiSettings, ProjectorPhase, create_app
from throughline.serve.auth import BearerAuth
from throughline.serve.exceptions import BindFailedError, ProjectorFailedError, RebuildRefusedError
from throughline.serve.http_protocol import http_protocol
from throughline.serve.metrics import ServeMetrics
from throughline.serve.projector_runs import live_run, projector_loop, rebuild_replay
from throughline.serve.rebuild import PausableProjector, Rebuild, SpareAhead, rebuild_metrics
from throughline.serve.security import (
    KeyWatcher,
    TlsOptions,
    client_context,
    redact_access_log,
    server_context,
)
from throughline.serve.switchable import SwitchableProjection
from throughline.serve.tokens import DEFAULT_AUDIENCE, KeyRing, VerifiedTokens
from throughline.settings import Settings

if TYPE_CHECKING:
    from throughline.log.group import GroupView
    from throughline.projector.group_runner import GroupSpec
    from throughline.projector.rebuild_files import RebuildFiles
    from throughline.serve.group import GroupRouter

_log = logging.getLogger("throughline.serve")

#: Retriable projector failures (a broker away) are retried for this long before the service gives up.
RETRY_WINDOW = 300.0
RETRY_FIRST = 1.0
RETRY_MAX = 10.0  # a restarted broker is noticed within this many seconds
#: A run that lasted this long was healthy: a failure after it starts a new retry window.
HEALTHY_RUN = 60.0
MAX_PROJECTOR_ATTEMPTS = 1_000_000
#: Bound on the wait for HTTP requests in flight after a stop (long-polls are released at once).
DEFAULT_GRACEFUL_TIMEOUT = 10


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """Everything ``throughline serve`` is told beyond the connection settings."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api: ApiSettings = field(default_factory=ApiSettings)
    token_key_file: str | None = None
    partitions: int | None = None  # partitions of the topic when serve creates it
    replication_factor: int | None = None  # ``--replication-factor`` (None: min(3, brokers))
    min_insync_replicas: int | None = None  # ``--min-insync-replicas`` (None: min(2, RF))
    projector: bool = True  # False: serve a projection read-only, without advancing it
    allow_lossy_topic: bool = False
    sync_commits: bool = False  # fsync every commit (``DuckProjection.open``), not only checkpoints
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    log_level: str = "warning"
    access_log: bool = False
    group: GroupSpec | None = None  # ``--group``: a member of a group of serve processes (docs/scale-out.md)
    token_keys: str | None = None  # ``--token-keys``: scoped tokens' verification keys (docs/security.md)
    token_audience: str = DEFAULT_AUDIENCE
    tls: TlsOptions | None = None  # ``--tls-cert``/``--tls-key``: HTTPS
    bootstrap_from: str | None = None  # ``--bootstrap-from``: a new file starts from a peer's projection snapshot
    rebuild: bool = False  # ``--rebuild``: rebuild the projection without downtime at start (``serve.rebuild``)


class ProjectorThread:
    """Runs a projector loop on a thread and remembers how it ended (implements ``ProjectorState``).

    A retriable failure (the broker went away) restarts the loop after a backoff (1 s doubling to ``RETRY_MAX``)
    instead of ending the service; the service is then not ready. Failures that go on for longer than
    ``retry_window`` seconds without a healthy run in between, and any other failure, end the loop:
    the service then stops and exits 1, so that a supervisor restarts it or an operator sees why.
    """

    def __init__(
        self,
        loop: Callable[[threading.Event], object],
        *,
        on_exit: Callable[[], None],
        retry_window: float = RETRY_WINDOW,
        retry_first: float = RETRY_FIRST,
    ) -> None:
        self.stop = threading.Event()
        self._retry_first = retry_first
        self._loop = loop
        self._on_exit = on_exit
        self._retry_window = retry_window
        self._error: ThroughlineError | None = None
        self._retrying: ThroughlineError | None = None
        self._thread = threading.Thread(target=self._run, name="throughline-projector", daemon=True)

    def start(self) -> None:
        """Start the loop."""
        self._thread.start()

    def _run(self) -> None:
        try:
            self._run_with_retries()
        except ThroughlineError as exc:
            self._error = exc
        except Exception as exc:  # reported to the operator, then the service stops
            _log.error("the projector failed", exc_info=exc)
            self._error = ProjectorFailedError(f"the projector failed: {exc.__class__.__name__}: {exc}")
        finally:
            if self._error is not None:
                _log.error("projector stopped: %s: %s", self._error.code, self._error.message)
            self._on_exit()

    def _run_with_retries(self) -> None:
        backoff = self._retry_first
        failing_since: float | None = None
        for _attempt in range(MAX_PROJECTOR_ATTEMPTS):
            started = time.monotonic()
            try:
                self._loop(self.stop)
            except ThroughlineError as exc:
                if exc.retriable and self.stop.is_set():
                    # Stopping while the broker is away (its request ran out of time): a clean stop; the
                    # projection holds what was committed, and the next start resumes from there.
                    _log.warning("projector: %s while stopping: %s", exc.code, exc.message)
                    return
                if not exc.retriable:
                    raise
                now = time.monotonic()
                if now - started >= HEALTHY_RUN:  # it ran well for a while: a new outage starts now
                    failing_since, backoff = None, self._retry_first
                failing_since = now if failing_since is None else failing_since
                if now - failing_since > self._retry_window:
                    raise
                self._retrying = exc
                _log.warning("projector: %s: %s; retrying in %.0fs", exc.code, exc.message, backoff)
                if self.stop.wait(backoff):
                    return
                backoff = min(backoff * 2, RETRY_MAX)
                self._retrying = None  # trying again; a new failure sets it again
                continue
            if not self.stop.is_set():
                raise ProjectorFailedError("the projector stopped without being asked to")
            return
        raise ProjectorFailedError(f"the projector failed {MAX_PROJECTOR_ATTEMPTS} times")

    def phase(self) -> ProjectorPhase:
        """``running``, ``retrying`` (after a retriable failure), ``stopped`` (asked to stop) or ``failed``."""
        if self._error is not None:
            return "failed"
        if self._thread.is_alive() and not self.stop.is_set():
            return "retrying" if self._retrying is not None else "running"
        return "stopped"

    def error(self) -> ThroughlineError | None:
        """Why the loop ended (``failed``), or why it is being retried (``retrying``)."""
        return self._error or self._retrying

    def join(self, timeout: float, abort: threading.Event | None = None) -> bool:
        """Ask the loop to stop and wait (bounded, or until ``abort``) for it to commit and return.

        ``True`` when it returned. Abandoning it is safe: a batch is committed whole or not at all.
        """
        self.stop.set()
        if self._thread.ident is None:
            return True
        deadline = time.monotonic() + timeout
        while self._thread.is_alive() and not (abort is not None and abort.is_set()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._thread.join(min(remaining, 0.1))
        return not self._thread.is_alive()


class NoProjector:
    """``serve --no-projector``: the projection is only read; nothing here advances it."""

    def phase(self) -> ProjectorPhase:
        """Always ``off``."""
        return "off"

    def error(self) -> ThroughlineError | None:
        """Never failed."""
        return None


class _Server(uvicorn.Server):
    """uvicorn, minus its own signal handling (the service owns the signals), plus a ready callback."""

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_ready = on_ready

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn re-raises a captured SIGTERM after its shutdown, which would end the process with
        # "killed by signal" before the projector commits; the service handles signals itself.
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and not self.should_exit:
            self._on_ready()


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port`` 0: the OS picks a free one)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise BindFailedError(f"cannot resolve --host {host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise BindFailedError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def url_of(sock: socket.socket, host: str, scheme: str = "http") -> str:
    """The URL a client uses for a bound socket."""
    port = sock.getsockname()[1]
    shown = host
    if host in ("0.0.0.0", ""):
        shown = "127.0.0.1"
    elif host == "::":
        shown = "::1"
    if ":" in shown:
        shown = f"[{shown}]"
    return f"{scheme}://{shown}:{port}"


def _configure_logging(level: str) -> None:
    root = logging.getLogger("throughline")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(level.upper())


def run_service(
    settings: Settings,
    options: ServeOptions,
    *,
    announce: Callable[[str], None],
) -> int:
    """Run ``throughline serve`` until a signal (returns 0) or a projector failure (raises its error);
    ``announce`` is given the URL once the server accepts requests (the command prints it)."""
    from throughline.log import DEFAULT_PARTITIONS, KafkaLog, TopicWatch, ensure_topic
    from throughline.projector.feed import spawn_worker_ahead
    from throughline.projector.rebuild_files import RebuildFiles, remove_turn_keys, turn_keys_of
    from throughline.projector.store import DuckProjection

    _configure_logging(options.log_level)
    if options.rebuild and (not options.projector or options.group is not None):
        raise RebuildRefusedError(
            "serve --rebuild rebuilds what its own projector writes: not with --no-projector or --group"
        )
    servers = settings.require_bootstrap()
    kafka_config = settings.kafka_config()
    token_key = _token_key(settings, options)
    ring = KeyRing(options.token_keys) if options.token_keys else None
    tls = server_context(options.tls) if options.tls is not None else None
    peers = client_context(options.tls.peer_ca, cert=options.tls.cert, key=options.tls.key) if options.tls else None
    sock = bind_socket(options.host, options.port)
    url = url_of(sock, options.host, "https" if tls is not None else "http")
    projector: ProjectorThread | None = None
    with contextlib.ExitStack() as stack:
        stack.callback(sock.close)
        if options.projector:
            # As the producers do: a missing topic is created to keep every record; a lossy one is refused.
            ensure_topic(
                servers,
                settings.topic,
                partitions=options.partitions or DEFAULT_PARTITIONS,
                allow_lossy=options.allow_lossy_topic,
                kafka_config=kafka_config,
                replication_factor=options.replication_factor,
                min_insync_replicas=options.min_insync_replicas,
            )
        if options.bootstrap_from is not None:
            from throughline.serve.cut_api import bootstrap_from, bootstrap_token

            bootstrap_from(
                options.bootstrap_from,
                Path(settings.db),
                bootstrap_servers=servers,
                topic=settings.topic,
                kafka_config=kafka_config,
                token=bootstrap_token(options.api.auth_token),
                context=peers,
            )

        def open_projection(path: object, read_only: bool = False) -> DuckProjection:
            return DuckProjection.open(
                str(path), read_only=read_only, topic=settings.topic, sync_commits=options.sync_commits
            )

        def open_rebuilt(path: Path) -> DuckProjection:
            # With the turn keys its replay kept: a scan of them here would take the GIL from the reads
            # while the new file catches up (docs/design.md, "Rebuilding without downtime").
            rebuilt = open_projection(path)
            try:
                rebuilt.adopt_turn_keys(turn_keys_of(path))
            except BaseException:
                rebuilt.close()
                raise
            finally:
                remove_turn_keys(path)
            return rebuilt

        # A rebuild a crash interrupted: finished (it had switched) or removed (it had not), before opening.
        files = RebuildFiles(Path(settings.db))
        files.recover(lambda path: open_projection(path).close())
        stack.callback(_finish_rebuild, files, open_projection)
        projection = open_projection(settings.db, read_only=not options.projector)
        # Reads go through the switchable facade: a rebuild replaces the handle under them.
        reads = SwitchableProjection(projection)
        stack.callback(reads.close)
        log = KafkaLog(servers, settings.topic, kafka_config=kafka_config)
        stack.callback(log.close)

        metrics = ServeMetrics()
        stopping = threading.Event()
        server_box: list[_Server] = []

        def request_stop() -> None:
            stopping.set()
            if server_box:
                server_box[0].should_exit = True

        forced = threading.Event()

        def force_stop() -> None:
            forced.set()
            request_stop()
            if server_box:
                server_box[0].force_exit = True

        state: ProjectorThread | NoProjector = NoProjector()
        router: GroupRouter | None = None
        on_change: Callable[[GroupView], None] | None = None
        on_leave: Callable[[], None] | None = None
        if options.group is not None:
            from throughline.serve.group import GroupRouter, Membership

            membership = Membership(options.group.group, options.group.url, options.group.copies)
            router = GroupRouter(
                membership, log, lambda p: int(reads.applied_offsets().get(p, 0)), options.api.read_wait, peers
            )
            on_change, on_leave = membership.on_change, membership.on_leave
        rebuild: Rebuild[DuckProjection] | None = None
        if options.projector and options.group is None:
            live = PausableProjector(live_run(servers, settings.topic, metrics, kafka_config), projection)
            projector = ProjectorThread(live, on_exit=request_stop)
            state = projector
            # The new file's fetch worker, started now rather than with a rebuild (docs/design.md,
            # "Rebuilding without downtime"); stopped after any rebuild ended (callbacks run last first).
            spare = SpareAhead(spawn_worker_ahead)
            stack.callback(spare.close)
            spare.prepare()
            rebuild = Rebuild(
                files=files,
                reads=reads,
                live=live,
                open_new=open_rebuilt,
                replay=rebuild_replay(servers, settings.topic, kafka_config, sync_commits=options.sync_commits),
                stopping=stopping,
                on_status=rebuild_metrics(metrics),
                start_ahead=spare,
            )
            stack.callback(rebuild.join, DEFAULT_GRACEFUL_TIMEOUT)
        elif options.projector:
            from throughline.serve.cut_api import bootstrap_token, peer_cut_fetcher

            projector = ProjectorThread(
                projector_loop(
                    projection,
                    servers,
                    settings.topic,
                    metrics,
                    kafka_config,
                    group=options.group,
                    on_change=on_change,
                    on_leave=on_leave,
                    peer_cuts=peer_cut_fetcher(bootstrap_token(options.api.auth_token), peers),
                ),
                on_exit=request_stop,
            )
            state = projector
        verified = VerifiedTokens(ring, options.token_audience) if ring is not None else None
        app = create_app(
            projection=reads,
            log=log,
            token_key=token_key,
            settings=options.api,
            metrics=metrics,
            projector=state,
            stopping=stopping,
            router=router,
            replication=TopicWatch(servers, settings.topic, kafka_config=kafka_config).describe,
            tokens=verified,
        )
        from throughline.serve.cut_api import install_cut_route

        auth = BearerAuth(options.api.auth_token, verified)
        # The snapshot is of the file reads go to now (a rebuild switches it).
        install_cut_route(app, lambda: reads.current, auth)
        install_rebuild_routes(app, auth, rebuild)
        config = uvicorn.Config(
            app,
            lifespan="on",
            http=http_protocol(),  # httptools when installed (bounded like h11), else h11
            loop="asyncio",
            log_level=options.log_level,
            access_log=options.access_log,
            server_header=False,
            proxy_headers=False,
            timeout_graceful_shutdown=DEFAULT_GRACEFUL_TIMEOUT,
            # The bound on a request head, for h11 and (http_protocol) httptools alike.
            h11_max_incomplete_event_size=max(64 * 1024, options.api.max_query_bytes * 2),
        )
        config.load()
        config.ssl = tls  # ours: uvicorn's own context would allow TLS below 1.2
        redact_access_log()
        if ring is not None:
            stack.enter_context(KeyWatcher(ring))
        server = _Server(config, on_ready=lambda: announce(url))
        server_box.append(server)

        def on_first_signal(signum: int) -> None:
            _log.warning("signal %s: stopping (finishing requests and the batch in flight)", signum)
            request_stop()

        with StopOnSignals(on_first_signal, lambda _signum: force_stop()):
            if projector is not None:
                projector.start()
            if rebuild is not None and options.rebuild:
                rebuild.start()
            try:
                asyncio.run(server.serve(sockets=[sock]))
            finally:
                request_stop()
                stopped_at = time.monotonic()
                # No request is answered any more: reads still queued for the log view (during a broker
                # failover each of its requests waits out its timeout) give up now instead of keeping
                # the process alive one timeout each after the service is done.
                log.close()
                if projector is not None and not projector.join(options.drain_timeout, abort=forced):
                    _log.error(
                        "stopping without waiting for the projector (%s); a batch it had not committed is "
                        "applied again on the next start",
                        "second signal" if forced.is_set() else f"--drain-timeout {options.drain_timeout:g}s",
                    )
                _log.info("stopped: HTTP closed, projector joined %.1fs later", time.monotonic() - stopped_at)
    # Only a projector that failed ends the service with its error: one stopped while it waited to retry
    # (a broker away at the signal) stopped cleanly.
    failure = projector.error() if projector is not None and projector.phase() == "failed" else None
    if failure is not None:
        raise failure
    return 0


def _token_key(settings: Settings, options: ServeOptions) -> bytes:
    """The page-token key; a group member takes only a shared one (never a file beside its own --db)."""
    from throughline.reader.exceptions import TokenKeyError
    from throughline.reader.token_key import ENV_TOKEN_KEY, ENV_TOKEN_KEY_FILE, resolve_token_key

    if options.group is None:
        return resolve_token_key(db_path=settings.db, key_file=options.token_key_file)
    try:
        return resolve_token_key(db_path=None, key_file=options.token_key_file)
    except TokenKeyError as exc:
        if "no page-token key" not in exc.message:
            raise
        raise TokenKeyError(
            f"serve --group needs the group's shared page-token key: set {ENV_TOKEN_KEY}, or pass --token-key-file "
            f"(or set {ENV_TOKEN_KEY_FILE}) naming one key file every member reads, so that a page token one "
            "member issued is valid on every other"
        ) from None


def _finish_rebuild(files: RebuildFiles, open_projection: Callable[..., Any]) -> None:
    """At stop, with every handle closed: move a switched-to rebuilt file to --db (``RebuildFiles.finish``);
    a failure leaves the marker, and the next start finishes it."""
    try:
        files.finish(lambda path: open_projection(path).close())
    except Exception as exc:
        _log.error("the rebuilt projection stays at %s until the next start: %s", files.rebuilt, exc)
