"""Test support for throughline: a real Apache Kafka broker, provisioned three ways, and
``throughline serve`` in a container for users' own integration suites (:class:`ThroughlineContainer`).

See the package :mod:`throughline.testing.kafka` for the details, and
:mod:`throughline.testing.pytest_plugin` for the pytest fixtures (``kafka_bootstrap``, ``kafka_broker``,
``kafka_topic_name``, ...).

Modules: ``kafka`` (the broker, three ways), ``pytest_plugin`` (the fixtures), ``pytest_entry`` (the
``pytest11`` entry point, which loads the plugin only where the ``test`` extra is installed),
``containers`` (``ThroughlineContainer``), ``hosts`` (``HostAdapterContract``, the tests every host
adapter must pass).

The names below are re-exported lazily, so that importing ``throughline.testing`` loads neither
kafka-python nor the harness until a name is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from throughline.testing.containers import ThroughlineContainer
    from throughline.testing.kafka import (
        DOCKER_IMAGE,
        KAFKA_VERSION,
        BrokerSettings,
        BrokerStartError,
        BrokerState,
        DockerKafka,
        DockerUnavailableError,
        ExternalKafka,
        HarnessError,
        JavaNotFoundError,
        KafkaBroker,
        KafkaDistribution,
        KafkaHandle,
        MavenFetchError,
        admin_client,
        create_topic,
        docker_available,
        fetch_kafka_jars,
        free_port,
        kafka_cache_dir,
        provision_kafka,
        provision_private_kafka,
        running_broker,
        start_broker,
        wait_for_kafka,
    )

__all__ = [
    "DOCKER_IMAGE",
    "KAFKA_VERSION",
    "BrokerSettings",
    "BrokerStartError",
    "BrokerState",
    "DockerKafka",
    "DockerUnavailableError",
    "ExternalKafka",
    "HarnessError",
    "JavaNotFoundError",
    "KafkaBroker",
    "KafkaDistribution",
    "KafkaHandle",
    "MavenFetchError",
    "admin_client",
    "create_topic",
    "docker_available",
    "fetch_kafka_jars",
    "free_port",
    "kafka_cache_dir",
    "provision_kafka",
    "provision_private_kafka",
    "running_broker",
    "start_broker",
    "wait_for_kafka",
    "ThroughlineContainer",
]

# Each name lives in one module; the ones not listed here are the Kafka harness's.
_MODULE_OF = {"ThroughlineContainer": "throughline.testing.containers"}


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(_MODULE_OF.get(name, "throughline.testing.kafka")), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
