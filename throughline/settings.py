"""Connection settings shared by every command: flags first, then the environment, then defaults.

The flags themselves, and their resolution against the environment (``settings_from``), are the
commands' (``throughline.commands.options``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from throughline.log.config import KafkaClientConfig, resolve_kafka_config
from throughline.log.exceptions import MissingBootstrapServersError

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
