"""Choosing a provider: external if configured, else Docker if an engine answers, else the JVM broker.

Under ``auto``, a Docker engine that answers but cannot run the Kafka image (it cannot be pulled, no
registry, the container does not start) is not an error: the harness says so in one line and uses the
JVM broker, and it does not try that image again in this process. With ``docker`` forced, the same
reason is raised as :class:`DockerUnavailableError` (or :class:`BrokerStartError` with the container's
log when Kafka in it never became ready).
"""

from __future__ import annotations

import os
import threading

from throughline.log import resolve_kafka_config
from throughline.testing.kafka.admin import wait_for_kafka
from throughline.testing.kafka.config import ENV_BOOTSTRAP, ENV_PROVIDER, Reporter, stderr_reporter
from throughline.testing.kafka.docker import DockerKafka, docker_unavailable_reason, kafka_image
from throughline.testing.kafka.exceptions import BrokerStartError, DockerUnavailableError, HarnessError
from throughline.testing.kafka.handle import ExternalKafka, KafkaHandle
from throughline.testing.kafka.jvm import KafkaBroker

PROVIDERS = ("auto", "external", "docker", "jvm")

# Images the docker provider could not run in this process, with the reason (auto asks only once).
_DOCKER_FAILED: dict[str, str] = {}
_DOCKER_FAILED_LOCK = threading.Lock()


def provider_choice(provider: str | None = None) -> str:
    """``provider`` or ``THROUGHLINE_KAFKA_PROVIDER`` (default ``auto``), checked."""
    choice = (provider or os.environ.get(ENV_PROVIDER, "") or "auto").strip().lower()
    if choice not in PROVIDERS:
        raise HarnessError(f"{ENV_PROVIDER}={choice!r}: expected auto, external, docker or jvm")
    return choice


def _docker_or_none(choice: str, report: Reporter, timeout_s: float | None) -> DockerKafka | None:
    """A started Docker broker, or None when ``auto`` should fall back to the JVM (said once, with why)."""
    image = kafka_image()
    with _DOCKER_FAILED_LOCK:
        earlier = _DOCKER_FAILED.get(image)
    if earlier is not None and choice == "auto":
        return None
    reason = docker_unavailable_reason()
    if reason is not None:
        if choice == "docker":
            raise DockerUnavailableError(f"provider 'docker' was requested but {reason}")
        return None  # no engine at all: the ordinary case without Docker, nothing to say
    try:
        return DockerKafka(image, startup_timeout_s=timeout_s, report=report).start()
    except (DockerUnavailableError, BrokerStartError) as exc:
        if choice == "docker":
            raise
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        with _DOCKER_FAILED_LOCK:
            first = image not in _DOCKER_FAILED
            _DOCKER_FAILED[image] = why
        if first:
            report(f"docker provider unavailable, falling back to the JVM broker: {why}")
        return None


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
    choice = provider_choice(provider)

    external = os.environ.get(ENV_BOOTSTRAP, "").strip()
    if choice == "external" and not external:
        raise HarnessError(f"provider 'external' needs {ENV_BOOTSTRAP}=host:port")
    if choice in {"auto", "external"} and external:
        # A secured external cluster: the same client properties file every throughline command reads.
        handle = ExternalKafka(bootstrap_servers=external, kafka_config=resolve_kafka_config())
        wait_for_kafka(
            external, timeout_s=timeout_s if timeout_s is not None else 30.0, kafka_config=handle.kafka_config
        )
        return handle

    if choice in {"auto", "docker"}:
        docker = _docker_or_none(choice, report, timeout_s)
        if docker is not None:
            return docker

    return KafkaBroker(report=report).start(timeout_s=timeout_s)


def provision_private_kafka(
    *,
    provider: str | None = None,
    report: Reporter | None = None,
    timeout_s: float | None = None,
) -> KafkaBroker | DockerKafka:
    """A new broker owned by the caller, for tests that stop, kill or restart it.

    Unlike :func:`provision_kafka` this never returns the external broker: ``docker`` if forced
    or (under ``auto``/``external``) if an engine answers and runs the image, else a JVM broker.
    """
    report = report or stderr_reporter
    choice = provider_choice(provider)
    if choice != "jvm":
        docker = _docker_or_none("docker" if choice == "docker" else "auto", report, timeout_s)
        if docker is not None:
            return docker
    return KafkaBroker(report=report).start(timeout_s=timeout_s)
