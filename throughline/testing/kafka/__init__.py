"""A real Apache Kafka broker for tests, benchmarks and local development.

Three ways to get one, tried in this order by :func:`provision_kafka`:

1. **external** -- ``THROUGHLINE_TEST_BOOTSTRAP_SERVERS`` is set: use that broker, start nothing.
2. **docker** -- a Docker engine answers a ping: run ``THROUGHLINE_KAFKA_IMAGE`` (default
   ``apache/kafka:4.1.0``; a single KRaft node) with testcontainers. An engine that cannot run the
   image (no registry to pull it from) makes ``auto`` fall back to the JVM broker, with one line.
3. **jvm** -- otherwise: fetch Apache Kafka 4.1.0 jars from Maven Central once (with ``mvn``) into
   a cache folder, and run ``kafka.Kafka`` as a combined broker+controller on loopback ports.

``THROUGHLINE_KAFKA_PROVIDER=external|docker|jvm`` forces one of them (``auto`` is the default).

Every broker this module starts listens on 127.0.0.1 only, and every wait is bounded in time.

The package's modules, one concern each: :mod:`~throughline.testing.kafka.maven` (the jars),
:mod:`~throughline.testing.kafka.jvm` (the JVM broker), :mod:`~throughline.testing.kafka.docker` (the
docker provider), :mod:`~throughline.testing.kafka.provision` (choosing one),
:mod:`~throughline.testing.kafka.handle` (what they return), :mod:`~throughline.testing.kafka.cluster`
(three JVM nodes as one KRaft cluster, for leader and controller failovers), :mod:`~throughline.testing.kafka.admin`
(readiness and topics), :mod:`~throughline.testing.kafka.secured` (a JVM broker with secured
listeners, and the files and client configs to reach it), :mod:`~throughline.testing.kafka.apicurio`
(a real schema registry for the tests: Apicurio Registry's server from Maven Central, on loopback),
:mod:`~throughline.testing.kafka.cli` (the command line);
:mod:`~throughline.testing.kafka.config`, :mod:`~throughline.testing.kafka.support` and
:mod:`~throughline.testing.kafka.exceptions` hold what they share.

Command line (also wrapped by ``scripts/kafka-local``)::

    python -m throughline.testing.kafka start  [--state-dir DIR]   # detached broker, prints `export ...`
    python -m throughline.testing.kafka status [--state-dir DIR]
    python -m throughline.testing.kafka stop   [--state-dir DIR] [--keep-data]
    python -m throughline.testing.kafka fetch                      # only fetch the jars
    python -m throughline.testing.kafka fetch-registry             # only fetch Apicurio Registry

Environment variables:

``THROUGHLINE_TEST_BOOTSTRAP_SERVERS``
    Use this broker instead of starting one.
``THROUGHLINE_KAFKA_PROVIDER``
    ``auto`` (default), ``external``, ``docker`` or ``jvm``.
``THROUGHLINE_KAFKA_CACHE``
    Where the Maven-fetched jars live (default ``~/.cache/throughline/kafka-4.1.0``).
``THROUGHLINE_REGISTRY_CACHE``
    Where Apicurio Registry's server is unpacked (default ``~/.cache/throughline/apicurio-registry-3.3.3``).
``THROUGHLINE_TEST_SCHEMA_REGISTRY``
    A schema registry's Confluent-compatible base URL: the tests use it instead of starting Apicurio.
``THROUGHLINE_KAFKA_STATE``
    State folder of the CLI's detached broker (default ``./.cache/kafka-local``).
``THROUGHLINE_KAFKA_KEEP_WORKDIR``
    ``1`` keeps a JVM broker's work dir (data, ``logs/broker.log``) after it stops.
``THROUGHLINE_KAFKA_LOG_LEVEL``
    log4j2 level for the JVM broker's ``logs/broker.log`` (default ``WARN``).
``THROUGHLINE_KAFKA_STARTUP_TIMEOUT``
    Seconds to wait for a broker to answer (default 90).
``THROUGHLINE_HARNESS_TAG``
    Added to the broker's java command line as ``-Dthroughline.harness.tag=...`` (and to a Docker
    broker's labels) so that a CI script can find, and stop, exactly the brokers it started.
``THROUGHLINE_KAFKA_IMAGE``
    The docker provider's Kafka image (default ``apache/kafka:4.1.0``; docs/testing.md).
``THROUGHLINE_DOCKER_NETWORK``
    ``host`` or ``bridge`` for the docker provider's containers (default: host for a local engine).
"""

from __future__ import annotations

from throughline.testing.kafka.admin import admin_client, client_config_for, create_topic, wait_for_kafka
from throughline.testing.kafka.cli import BrokerState, default_state_dir, main
from throughline.testing.kafka.cluster import KafkaCluster
from throughline.testing.kafka.config import (
    DEFAULT_STARTUP_TIMEOUT_S,
    DEFAULT_STOP_TIMEOUT_S,
    DOCKER_IMAGE,
    ENV_BOOTSTRAP,
    ENV_CACHE,
    ENV_HARNESS_TAG,
    ENV_KEEP_WORKDIR,
    ENV_LOG_LEVEL,
    ENV_PROVIDER,
    ENV_STARTUP_TIMEOUT,
    ENV_STATE,
    KAFKA_VERSION,
    LOOPBACK,
    SCALA_VERSION,
    Reporter,
    startup_timeout_s,
)
from throughline.testing.kafka.docker import DockerKafka, docker_available
from throughline.testing.kafka.exceptions import (
    BrokerStartError,
    DockerUnavailableError,
    HarnessError,
    JavaNotFoundError,
    MavenFetchError,
)
from throughline.testing.kafka.handle import ExternalKafka, KafkaHandle
from throughline.testing.kafka.jvm import (
    BrokerSettings,
    KafkaBroker,
    find_java,
    running_broker,
    start_broker,
)
from throughline.testing.kafka.maven import KafkaDistribution, fetch_kafka_jars, kafka_cache_dir
from throughline.testing.kafka.provision import provision_kafka, provision_private_kafka
from throughline.testing.kafka.support import free_port

__all__ = [
    "DEFAULT_STARTUP_TIMEOUT_S",
    "DEFAULT_STOP_TIMEOUT_S",
    "DOCKER_IMAGE",
    "ENV_BOOTSTRAP",
    "ENV_CACHE",
    "ENV_HARNESS_TAG",
    "ENV_KEEP_WORKDIR",
    "ENV_LOG_LEVEL",
    "ENV_PROVIDER",
    "ENV_STARTUP_TIMEOUT",
    "ENV_STATE",
    "KAFKA_VERSION",
    "LOOPBACK",
    "SCALA_VERSION",
    "BrokerSettings",
    "BrokerStartError",
    "BrokerState",
    "DockerKafka",
    "DockerUnavailableError",
    "ExternalKafka",
    "HarnessError",
    "JavaNotFoundError",
    "KafkaBroker",
    "KafkaCluster",
    "KafkaDistribution",
    "KafkaHandle",
    "MavenFetchError",
    "Reporter",
    "admin_client",
    "client_config_for",
    "create_topic",
    "default_state_dir",
    "docker_available",
    "fetch_kafka_jars",
    "find_java",
    "free_port",
    "kafka_cache_dir",
    "main",
    "provision_kafka",
    "provision_private_kafka",
    "running_broker",
    "start_broker",
    "startup_timeout_s",
    "wait_for_kafka",
]
