"""Choosing a provider: external if configured, else Docker if an engine answers, else the JVM broker."""

from __future__ import annotations

import os

from throughline.log import resolve_kafka_config
from throughline.testing.kafka.admin import wait_for_kafka
from throughline.testing.kafka.config import ENV_BOOTSTRAP, ENV_PROVIDER, Reporter, stderr_reporter
from throughline.testing.kafka.docker import DockerKafka, docker_available
from throughline.testing.kafka.exceptions import DockerUnavailableError, HarnessError
from throughline.testing.kafka.handle import ExternalKafka, KafkaHandle
from throughline.testing.kafka.jvm import KafkaBroker


def provision_kafka(
    *,
    provider: str | None = None,
    report: Reporter | None = None,
    timeout_s: float | None = None,
) -> KafkaHandle:
    """Give the caller a ready broker: external if configured, else Docker if it answers, else a JVM.

    ``provider`` (or ``THROUGHLINE_KAFKA_PROVIDER``) may force ``external``, ``docker`` or ``jvm``.
    Call ``.close()`` on the result when done (a no-op for an external broker).
    """
    report = report or stderr_reporter
    choice = (provider or os.environ.get(ENV_PROVIDER, "") or "auto").strip().lower()
    if choice not in {"auto", "external", "docker", "jvm"}:
        raise HarnessError(f"{ENV_PROVIDER}={choice!r}: expected auto, external, docker or jvm")

    external = os.environ.get(ENV_BOOTSTRAP, "").strip()
    if choice == "external" and not external:
        raise HarnessError(f"provider 'external' needs {ENV_BOOTSTRAP}=host:port")
    if choice in {"auto", "external"} and external:
        # A secured external cluster: the same client properties file every throughline command reads.
        handle = ExternalKafka(bootstrap_servers=external, kafka_config=resolve_kafka_config())
        wait_for_kafka(external, timeout_s=timeout_s if timeout_s is not None else 30.0, kafka_config=handle.kafka_config)
        return handle

    if choice in {"auto", "docker"}:
        if docker_available():
            return DockerKafka(startup_timeout_s=timeout_s, report=report).start()
        if choice == "docker":
            raise DockerUnavailableError(
                "provider 'docker' was requested but no Docker engine answered a ping"
            )

    return KafkaBroker(report=report).start(timeout_s=timeout_s)


def provision_private_kafka(
    *,
    provider: str | None = None,
    report: Reporter | None = None,
    timeout_s: float | None = None,
) -> KafkaBroker | DockerKafka:
    """A new broker owned by the caller, for tests that stop, kill or restart it.

    Unlike :func:`provision_kafka` this never returns the external broker: ``docker`` if forced
    or (under ``auto``/``external``) if an engine answers, else a JVM broker.
    """
    report = report or stderr_reporter
    choice = (provider or os.environ.get(ENV_PROVIDER, "") or "auto").strip().lower()
    if choice == "jvm":
        return KafkaBroker(report=report).start(timeout_s=timeout_s)
    if docker_available():
        return DockerKafka(startup_timeout_s=timeout_s, report=report).start()
    if choice == "docker":
        raise DockerUnavailableError("provider 'docker' was requested but no Docker engine answered a ping")
    return KafkaBroker(report=report).start(timeout_s=timeout_s)
