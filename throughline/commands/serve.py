"""``throughline serve``: the projector plus the HTTP read API in one process (docs/http.md), and its
security options (scoped tokens, HTTPS; docs/security.md).

Prints one line on stdout once it accepts requests: its URL. Logs go to stderr. SIGTERM or SIGINT stop
it gracefully (exit 0); binding a non-loopback address without an auth token is refused (exit 2,
``auth_token_required``).
"""

from __future__ import annotations

import argparse
import os
import urllib.parse
from typing import TYPE_CHECKING, Any

from throughline.commands.options import (
    add_connection_options,
    add_replication_options,
    add_sync_commits,
    replication_overrides,
    seconds_argument,
    settings_from,
)
from throughline.commands.options import count_argument as _count
from throughline.reader.page import DEFAULT_BODY_LIMIT, DEFAULT_WAIT_TIMEOUT
from throughline.reader.token_key import ENV_TOKEN_KEY, ENV_TOKEN_KEY_FILE
from throughline.serve import DEFAULT_DRAIN_TIMEOUT, DEFAULT_HOST, DEFAULT_MAX_WAIT, DEFAULT_PORT
from throughline.serve.auth import ENV_AUTH_TOKEN, load_auth_token, require_token_off_loopback
from throughline.serve.exceptions import InvalidGroupOptionError, InvalidTlsOptionError
from throughline.serve.security import ENV_CA, require_tls_off_loopback

if TYPE_CHECKING:
    from throughline.projector.group_runner import GroupSpec

_LEVELS = ("critical", "error", "warning", "info", "debug")
ENV_GROUP = "THROUGHLINE_GROUP"
ENV_ADVERTISE_URL = "THROUGHLINE_ADVERTISE_URL"
ENV_COPIES = "THROUGHLINE_COPIES"
ENV_TOKEN_KEYS = "THROUGHLINE_TOKEN_KEYS"
#: ``off``: a member catches a partition it gains up from the log, never from a peer's snapshot.
ENV_PEER_BOOTSTRAP = "THROUGHLINE_GROUP_PEER_BOOTSTRAP"


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError("a port is 0..65535 (0 picks a free one)")
    return value


def register(subparsers: Any) -> None:
    """Add the ``serve`` subcommand."""
    p = subparsers.add_parser(
        "serve",
        help="run the projector and the HTTP read API in one process",
        description=(
            "Run the projector and the HTTP read API (GET/POST /v1/projects/read, /healthz, /readyz, "
            "/metrics, /openapi.json) in one process. Prints its URL on stdout once it accepts requests."
        ),
    )
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}, loopback only)")
    p.add_argument(
        "--port", type=_port, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks a free one)"
    )
    p.add_argument(
        "--auth-token-file",
        default=None,
        metavar="FILE",
        help=f"require `Authorization: Bearer <token>` with the token in FILE (or env {ENV_AUTH_TOKEN}); "
        "required when --host is not a loopback address",
    )
    p.add_argument(
        "--token-key-file",
        default=None,
        metavar="FILE",
        help=f"page-token key file (env {ENV_TOKEN_KEY_FILE}; {ENV_TOKEN_KEY} wins; default beside --db)",
    )
    p.add_argument(
        "--read-wait",
        type=seconds_argument,
        default=DEFAULT_WAIT_TIMEOUT,
        metavar="SECONDS",
        help=f"a read's bounded wait for the projector before projection_pending (default {DEFAULT_WAIT_TIMEOUT:g})",
    )
    p.add_argument(
        "--max-wait",
        type=seconds_argument,
        default=DEFAULT_MAX_WAIT,
        metavar="SECONDS",
        help=f"cap on a long-poll's wait (default {DEFAULT_MAX_WAIT:g})",
    )
    p.add_argument(
        "--max-waiters", type=_count(1), default=64, metavar="N", help="long-polls waiting at once (default 64)"
    )
    p.add_argument(
        "--body-limit",
        type=_count(0),
        default=DEFAULT_BODY_LIMIT,
        metavar="BYTES",
        help=f"cut served bodies to this many UTF-8 bytes (default {DEFAULT_BODY_LIMIT})",
    )
    p.add_argument(
        "--max-request-bytes",
        type=_count(1024),
        default=64 * 1024,
        metavar="BYTES",
        help="largest request body accepted (default 65536; larger: 413)",
    )
    p.add_argument(
        "--ready-max-lag",
        type=_count(0),
        default=100,
        metavar="RECORDS",
        help="/readyz answers ready while every partition lags at most this many records (default 100)",
    )
    p.add_argument(
        "--partitions",
        type=_count(1),
        default=None,
        metavar="N",
        help="partitions of the topic if serve has to create it (default: the log's default)",
    )
    add_replication_options(p)
    add_sync_commits(p)
    p.add_argument(
        "--allow-lossy-topic",
        action="store_true",
        help="accept a topic with finite retention, compaction or too little replication (records could be lost)",
    )
    p.add_argument(
        "--drain-timeout",
        type=seconds_argument,
        default=DEFAULT_DRAIN_TIMEOUT,
        metavar="SECONDS",
        help=f"on SIGTERM, wait this long for the projector to commit its batch (default {DEFAULT_DRAIN_TIMEOUT:g})",
    )
    p.add_argument(
        "--no-projector",
        action="store_true",
        help="only serve reads: open the projection read-only and do not consume the log "
        "(reads answer projection_pending for records nobody projects)",
    )
    p.add_argument(
        "--rebuild",
        action="store_true",
        help="rebuild the projection without downtime: replay the topic into a new file beside --db while this "
        "one serves, then switch reads to it (also POST /v1/admin/rebuild; docs/operations.md)",
    )
    p.add_argument(
        "--group",
        default=None,
        metavar="NAME",
        help=f"join the consumer group NAME of serve members on the topic: project only the partitions the group "
        f"assigns, answer every read (forwarding what another member holds) (env {ENV_GROUP}; docs/scale-out.md)",
    )
    p.add_argument(
        "--advertise",
        default=None,
        metavar="URL",
        help=f"with --group: the URL the other members forward reads to this one at (env {ENV_ADVERTISE_URL})",
    )
    p.add_argument(
        "--copies",
        type=_count(1),
        default=None,
        metavar="K",
        help=f"with --group: members that hold each partition (default 2 with two or more members; env {ENV_COPIES})",
    )
    p.add_argument(
        "--bootstrap-from",
        default=None,
        metavar="URL",
        help="when --db does not exist yet: build it from the projection snapshot of the serve at URL "
        "(GET URL/v1/admin/snapshot), then catch up from its offsets; a snapshot refused is logged and the "
        "log is replayed from offset 0 instead (docs/scale-out.md)",
    )
    add_security_options(p)
    p.add_argument("--log-level", choices=_LEVELS, default="warning", help="log level on stderr (default warning)")
    p.add_argument("--access-log", action="store_true", help="log every request on stderr")
    add_connection_options(p)
    p.set_defaults(func=_cmd_serve)


def _cmd_serve(args: argparse.Namespace) -> int:
    # The web stack loads only for this command, not for every `throughline` invocation.
    from throughline.serve.app import ApiSettings
    from throughline.serve.service import ServeOptions, run_service

    token = load_auth_token(args.auth_token_file)
    require_token_off_loopback(args.host, token, scoped=args.token_keys is not None)
    tls = tls_options(args)
    require_tls_off_loopback(args.host, tls, args.insecure_http)
    settings = settings_from(args)
    settings.require_bootstrap()  # fail fast, before binding anything
    replication_factor, min_insync_replicas = replication_overrides(args)
    group = _group_spec(args)
    if group is not None and group.url.startswith("https://") != (tls is not None):
        # Members forward each other's callers' tokens: over HTTPS exactly when this member serves it.
        raise InvalidGroupOptionError(
            "--advertise must be an https:// URL with --tls-cert, and an http:// URL without it"
        )
    options = ServeOptions(
        host=args.host,
        port=args.port,
        api=ApiSettings(
            auth_token=token,
            read_wait=args.read_wait,
            body_limit=args.body_limit,
            max_wait=args.max_wait,
            max_waiters=args.max_waiters,
            max_body_bytes=args.max_request_bytes,
            ready_max_lag=args.ready_max_lag,
        ),
        token_key_file=args.token_key_file,
        partitions=args.partitions,
        replication_factor=replication_factor,
        min_insync_replicas=min_insync_replicas,
        projector=not args.no_projector,
        allow_lossy_topic=args.allow_lossy_topic,
        sync_commits=args.sync_commits,
        drain_timeout=args.drain_timeout,
        log_level=args.log_level,
        access_log=args.access_log,
        group=group,
        token_keys=args.token_keys,
        token_audience=args.token_audience,
        tls=tls,
        bootstrap_from=_bootstrap_url(args.bootstrap_from),
        rebuild=args.rebuild,
    )
    return run_service(settings, options, announce=_announce)


def _announce(url: str) -> None:
    print(url, flush=True)


def _bootstrap_url(url: str | None) -> str | None:
    """``--bootstrap-from``, checked before anything binds (``invalid_bootstrap_url``, exit 2)."""
    if url is None:
        return None
    from throughline.serve.cut_api import snapshot_url

    snapshot_url(url)
    return url


def _group_spec(args: argparse.Namespace) -> GroupSpec | None:
    """``--group``/``--advertise``/``--copies`` (or their variables) as a ``GroupSpec``, or ``None``."""
    from throughline.projector.group_runner import GroupSpec

    name = args.group if args.group is not None else os.environ.get(ENV_GROUP) or None
    url = args.advertise if args.advertise is not None else os.environ.get(ENV_ADVERTISE_URL) or None
    copies = args.copies
    if copies is None and os.environ.get(ENV_COPIES):
        try:
            copies = _count(1)(os.environ[ENV_COPIES])
        except argparse.ArgumentTypeError as exc:
            raise InvalidGroupOptionError(f"{ENV_COPIES}: {exc}") from None
    if name is None:
        if args.advertise is not None or args.copies is not None:
            raise InvalidGroupOptionError("--advertise and --copies belong to --group NAME")
        return None
    if not name.strip() or len(name) > 249:
        raise InvalidGroupOptionError("--group NAME must be 1..249 characters")
    if url is None:
        raise InvalidGroupOptionError(
            f"--group needs --advertise URL (env {ENV_ADVERTISE_URL}): where the other members reach this one"
        )
    parts = urllib.parse.urlsplit(url)
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.query
        or parts.fragment
        or not url.isascii()
        or " " in url
    ):
        raise InvalidGroupOptionError(f"--advertise must be an http(s) URL such as http://10.0.0.5:8080, got {url!r}")
    if args.no_projector:
        raise InvalidGroupOptionError(
            "--group and --no-projector do not mix: a member projects the partitions it holds"
        )
    return GroupSpec(
        group=name,
        url=url.rstrip("/"),
        copies=copies,
        session_timeout_ms=_milliseconds("THROUGHLINE_GROUP_SESSION_TIMEOUT_MS"),
        max_poll_interval_ms=_milliseconds("THROUGHLINE_GROUP_MAX_POLL_INTERVAL_MS"),
        peer_bootstrap=_peer_bootstrap(),
    )


def _peer_bootstrap() -> bool:
    # Not a flag, as the session timeout: on by default; ``off`` is for a benchmark's baseline (catching up
    # from offset 0, as before peer bootstrap) and for an operator whose members cannot reach each other's
    # admin endpoint (no failed fetch per gained partition). Anything else is refused, never guessed.
    text = os.environ.get(ENV_PEER_BOOTSTRAP, "").strip().lower()
    if text in ("", "on"):
        return True
    if text == "off":
        return False
    raise InvalidGroupOptionError(f"{ENV_PEER_BOOTSTRAP} must be on or off, got {text!r}")


def _milliseconds(name: str) -> int | None:
    # Not flags: the tests (and an operator who knows Kafka's bounds) shorten how soon a dead member's
    # partitions move (the session timeout: Kafka's broker accepts 6 s .. 30 min by default) and how
    # long a member may go between two polls (the max poll interval, also the rebalance's timeout).
    text = os.environ.get(name)
    return int(text) if text and text.isdigit() and int(text) > 0 else None


def add_security_options(p: argparse.ArgumentParser) -> None:
    """``serve``'s scoped-token and HTTPS options."""
    p.add_argument(
        "--token-keys",
        default=os.environ.get(ENV_TOKEN_KEYS) or None,
        metavar="PATH",
        help=f"accept scoped tokens signed by the key file PATH or any key file in the folder PATH (env "
        f"{ENV_TOKEN_KEYS}); re-read on SIGHUP and when a file changes. Only public keys are used",
    )
    p.add_argument(
        "--token-audience",
        default="throughline",
        metavar="NAME",
        help="the audience tokens must name (default throughline)",
    )
    p.add_argument("--tls-cert", default=None, metavar="FILE", help="serve HTTPS with this certificate chain (PEM)")
    p.add_argument("--tls-key", default=None, metavar="FILE", help="the private key of --tls-cert (PEM)")
    p.add_argument(
        "--tls-client-ca",
        default=None,
        metavar="FILE",
        help="mutual TLS: require client certificates signed by this CA (PEM)",
    )
    p.add_argument(
        "--ca",
        default=None,
        metavar="FILE",
        help=f"the CA that signs the other members' certificates, for forwarding over https (env {ENV_CA}; "
        "default the system's)",
    )
    p.add_argument(
        "--insecure-http",
        action="store_true",
        help="allow plain HTTP on a non-loopback --host (only behind a TLS-terminating proxy)",
    )


def tls_options(args: argparse.Namespace) -> Any:
    """``--tls-cert``/``--tls-key``/``--tls-client-ca``/``--ca`` as ``TlsOptions``, or ``None`` (plain HTTP)."""
    from throughline.serve.security import TlsOptions

    cert, key = args.tls_cert, args.tls_key
    if (cert is None) != (key is None):
        raise InvalidTlsOptionError("--tls-cert and --tls-key go together")
    if cert is None:
        if args.tls_client_ca is not None:
            raise InvalidTlsOptionError("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    peer_ca = args.ca or os.environ.get(ENV_CA) or None
    return TlsOptions(cert=cert, key=key, client_ca=args.tls_client_ca, peer_ca=peer_ca)
