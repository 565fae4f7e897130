"""The options the commands share, and their reading into values the engine takes.

- the connection options (``--bootstrap-servers``, ``--kafka-config``, ``--schema-registry``, ``--topic``,
  ``--db``) and ``settings_from``, which resolves them against the environment into ``Settings``;
- argparse ``type``s for counts and seconds, ``--sync-commits`` and the replication options;
- the remote options (``--url``, ``--auth-token-file``, ``--ca``, ``--client-cert``, ``--client-key``) and
  ``http_reader_from_args``, an ``HttpReader`` when ``--url`` is given;
- ``command``: a subcommand that reads the connection options, and ``add_json_flag``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from throughline.core.seconds import finite_seconds
from throughline.log.config import ENV_KAFKA_CONFIG
from throughline.log.policy import check_override
from throughline.serve.auth import load_auth_token
from throughline.serve.client import ENV_CLIENT_CERT, ENV_CLIENT_KEY, ENV_URL, FOLLOW_WAIT, HttpReader
from throughline.serve.security import ENV_CA
from throughline.settings import (
    DEFAULT_DB,
    DEFAULT_TOPIC,
    ENV_BOOTSTRAP,
    ENV_DB,
    ENV_SCHEMA_REGISTRY,
    ENV_TOPIC,
    Settings,
)


def command(
    subparsers: Any, name: str, func: Callable[[argparse.Namespace], int], *, help: str, description: str
) -> argparse.ArgumentParser:
    """A subcommand run by ``func`` that reads the connection options."""
    parser: argparse.ArgumentParser = subparsers.add_parser(name, help=help, description=description)
    add_connection_options(parser)
    parser.set_defaults(func=func)
    return parser


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """``--json``: one JSON document instead of a table."""
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--bootstrap-servers``, ``--kafka-config``, ``--topic`` and ``--db`` (each falls back to its
    variable)."""
    group = parser.add_argument_group("connection")
    group.add_argument("--bootstrap-servers", default=None, help=f"Kafka bootstrap servers (env {ENV_BOOTSTRAP})")
    group.add_argument(
        "--kafka-config",
        default=None,
        metavar="FILE",
        help=f"Kafka client properties file: security.protocol, sasl.*, ssl.*, client.id (env {ENV_KAFKA_CONFIG}; "
        "see docs/kafka.md)",
    )
    group.add_argument(
        "--schema-registry",
        default=None,
        metavar="URL",
        help=f"schema registry (Confluent's REST API): producers write registry-framed records; readers resolve "
        f"schema ids through it (env {ENV_SCHEMA_REGISTRY}; see docs/kafka.md)",
    )
    group.add_argument(
        "--topic", default=None, help=f"topic of completed turns (env {ENV_TOPIC}, default {DEFAULT_TOPIC})"
    )
    group.add_argument("--db", default=None, help=f"DuckDB projection file (env {ENV_DB}, default {DEFAULT_DB})")


def settings_from(args: argparse.Namespace) -> Settings:
    """Resolve settings from parsed flags and the environment."""
    return Settings(
        bootstrap_servers=getattr(args, "bootstrap_servers", None) or os.environ.get(ENV_BOOTSTRAP) or None,
        topic=getattr(args, "topic", None) or os.environ.get(ENV_TOPIC) or DEFAULT_TOPIC,
        db=getattr(args, "db", None) or os.environ.get(ENV_DB) or DEFAULT_DB,
        kafka_config_path=getattr(args, "kafka_config", None) or os.environ.get(ENV_KAFKA_CONFIG) or None,
        schema_registry_url=getattr(args, "schema_registry", None) or os.environ.get(ENV_SCHEMA_REGISTRY) or None,
    )


def count_argument(minimum: int) -> Callable[[str], int]:
    """An argparse ``type`` for a flag given as a whole number of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}")
        return value

    return parse


def seconds_argument(text: str) -> float:
    """An argparse ``type`` for a flag given in seconds: finite and >= 0 (``throughline.core.seconds``)."""
    value = finite_seconds(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text!r}")
    return value


def add_sync_commits(parser: argparse.ArgumentParser) -> None:
    """``--sync-commits``, for the commands that keep a projection up to date (``project``, ``serve``)."""
    parser.add_argument(
        "--sync-commits",
        action="store_true",
        help="fsync every commit, not only checkpoints: survives a power loss without re-applying the last "
        "commits from the log, at the cost of freshness (docs/design.md, 'Commits are not fsynced')",
    )


def add_replication_options(parser: argparse.ArgumentParser) -> None:
    """``--replication-factor`` and ``--min-insync-replicas``, beside ``--partitions`` on the commands
    that may create the topic (docs/kafka.md, "Running on a production cluster")."""
    parser.add_argument(
        "--replication-factor",
        metavar="N",
        type=count_argument(1),
        default=None,
        help="replicas of each partition when the topic is created (default min(3, brokers)); "
        "also the least an existing topic must have",
    )
    parser.add_argument(
        "--min-insync-replicas",
        metavar="N",
        type=count_argument(1),
        default=None,
        help="min.insync.replicas when the topic is created (default min(2, replication factor)); "
        "also the least an existing topic must have",
    )


def replication_overrides(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """The ``--replication-factor`` / ``--min-insync-replicas`` given (``None``: not given), refused at
    once (``invalid_replication``) when the min ISR is above the replication factor."""
    rf = getattr(args, "replication_factor", None)
    isr = getattr(args, "min_insync_replicas", None)
    check_override(rf, isr)
    return rf, isr


def add_http_options(parser: argparse.ArgumentParser, *, status: bool = False) -> None:
    """``--url`` and ``--auth-token-file`` for commands that can go through ``throughline serve``
    (``status=True``: the wording of ``throughline status``, which asks for readiness)."""
    group = parser.add_argument_group("remote (throughline serve)")
    if status:
        what = (
            f"ask a running `throughline serve` at URL (env {ENV_URL}) for its readiness instead of opening "
            "--db; several comma-separated URLs (the members of a group) fail over to the first that answers"
        )
    else:
        what = (
            f"read through a running `throughline serve` at URL (env {ENV_URL}) instead of opening --db; "
            "several comma-separated URLs (the members of a `serve --group`) fail over on a connection error "
            "or HTTP 503, keeping the series; --wait, --body-limit, --token-key-file and the connection "
            "options are then the server's"
        )
    group.add_argument("--url", default=None, metavar="URL[,URL...]", help=what)
    group.add_argument(
        "--auth-token-file",
        default=None,
        metavar="FILE",
        help="bearer token for --url: the admin token or a scoped one from `throughline token issue` "
        "(env THROUGHLINE_AUTH_TOKEN)",
    )
    group.add_argument(
        "--ca",
        default=None,
        metavar="FILE",
        help=f"verify https:// --url servers with this CA certificate file (PEM; env {ENV_CA}; default the system's)",
    )
    group.add_argument(
        "--client-cert",
        default=None,
        metavar="FILE",
        help=f"mutual TLS: present this certificate (PEM, env {ENV_CLIENT_CERT}) to a serve with --tls-client-ca",
    )
    group.add_argument(
        "--client-key",
        default=None,
        metavar="FILE",
        help=f"the private key of --client-cert (PEM, env {ENV_CLIENT_KEY}; default: in the certificate file)",
    )


def http_reader_from_args(args: argparse.Namespace) -> HttpReader | None:
    """An ``HttpReader`` when ``--url`` (or ``THROUGHLINE_URL``) is set, else ``None`` (a comma-separated
    list fails over between the members it names).

    ``throughline read`` and ``throughline observe`` use it as
    ``with http_reader_from_args(args) or open_page_reader(...) as read_page``.
    """
    url = getattr(args, "url", None) or os.environ.get(ENV_URL) or None
    if not url:
        return None
    token = load_auth_token(getattr(args, "auth_token_file", None))
    # A following Observer long-polls: the server holds its empty first pages until turns arrive.
    ca = getattr(args, "ca", None) or os.environ.get(ENV_CA) or None
    cert = getattr(args, "client_cert", None) or os.environ.get(ENV_CLIENT_CERT) or None
    key = getattr(args, "client_key", None) or os.environ.get(ENV_CLIENT_KEY) or None
    wait = FOLLOW_WAIT if getattr(args, "follow", False) else 0.0
    return HttpReader(url, token=token, wait=wait, ca=ca, client_cert=cert, client_key=key)
