"""Connection settings shared by every command: flags first, then the environment, then defaults."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass

from throughline.core.seconds import finite_seconds
from throughline.log.config import ENV_KAFKA_CONFIG, KafkaClientConfig, resolve_kafka_config
from throughline.log.exceptions import MissingBootstrapServersError
from throughline.log.policy import check_override

DEFAULT_TOPIC = "throughline.turns"
DEFAULT_DB = "throughline.duckdb"
ENV_BOOTSTRAP = "THROUGHLINE_BOOTSTRAP_SERVERS"
ENV_TOPIC = "THROUGHLINE_TOPIC"
ENV_DB = "THROUGHLINE_DB"
ENV_SCHEMA_REGISTRY = "THROUGHLINE_SCHEMA_REGISTRY"


@dataclass(frozen=True, slots=True)
class Settings:
    """Where the log and the projection are, and how to connect to the log."""

    bootstrap_servers: str | None
    topic: str
    db: str
    kafka_config_path: str | None = None  # --kafka-config, else THROUGHLINE_KAFKA_CONFIG
    schema_registry_url: str | None = None  # --schema-registry, else THROUGHLINE_SCHEMA_REGISTRY

    def kafka_config(self) -> KafkaClientConfig:
        """The Kafka client settings (read and validated now): the properties file, else PLAINTEXT; a
        ``--schema-registry`` URL replaces the file's ``schema.registry.url`` (its auth and TLS keys stay)."""
        config = resolve_kafka_config(self.kafka_config_path, environ={})
        if not self.schema_registry_url:
            return config
        from throughline.log.registry_config import registry_settings

        current = config.schema_registry
        checked = registry_settings(self.schema_registry_url.strip(), source="--schema-registry")
        chosen = checked if current is None else dataclasses.replace(current, url=checked.url)
        return dataclasses.replace(config, schema_registry=chosen)

    def require_bootstrap(self) -> list[str]:
        """The bootstrap servers as a list, or a ``ConfigurationError`` naming the flag and variable."""
        if not self.bootstrap_servers:
            raise MissingBootstrapServersError(
                f"no Kafka bootstrap servers: pass --bootstrap-servers or set {ENV_BOOTSTRAP}",
            )
        return [s.strip() for s in self.bootstrap_servers.split(",") if s.strip()]


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
