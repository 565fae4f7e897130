"""Versions, environment variable names, defaults and small settings helpers of the Kafka harness."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from importlib import resources

from throughline.testing.kafka.exceptions import HarnessError

KAFKA_VERSION = "4.1.0"
SCALA_VERSION = "2.13"
DOCKER_IMAGE = f"apache/kafka:{KAFKA_VERSION}"
LOOPBACK = "127.0.0.1"


ENV_BOOTSTRAP = "THROUGHLINE_TEST_BOOTSTRAP_SERVERS"
ENV_PROVIDER = "THROUGHLINE_KAFKA_PROVIDER"
ENV_CACHE = "THROUGHLINE_KAFKA_CACHE"
ENV_STATE = "THROUGHLINE_KAFKA_STATE"
ENV_KEEP_WORKDIR = "THROUGHLINE_KAFKA_KEEP_WORKDIR"
ENV_LOG_LEVEL = "THROUGHLINE_KAFKA_LOG_LEVEL"
ENV_STARTUP_TIMEOUT = "THROUGHLINE_KAFKA_STARTUP_TIMEOUT"
ENV_HARNESS_TAG = "THROUGHLINE_HARNESS_TAG"
ENV_KAFKA_IMAGE = "THROUGHLINE_KAFKA_IMAGE"
ENV_DOCKER_NETWORK = "THROUGHLINE_DOCKER_NETWORK"

DEFAULT_STARTUP_TIMEOUT_S = 90.0
DEFAULT_STOP_TIMEOUT_S = 15.0
MAVEN_TIMEOUT_S = 900.0
FORMAT_TIMEOUT_S = 120.0
FETCH_LOCK_TIMEOUT_S = MAVEN_TIMEOUT_S + 60.0


# The package data (pom.xml, log4j2.xml, kafka-server-template.properties) lives beside these modules.
_PACKAGE = "throughline.testing.kafka"

Reporter = Callable[[str], None]


def stderr_reporter(message: str) -> None:
    """The default reporter: one ``[throughline.kafka]`` line on stderr."""
    print(f"[throughline.kafka] {message}", file=sys.stderr, flush=True)


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise HarnessError(f"{name}={raw!r} is not a number of seconds") from exc


def env_flag(name: str) -> bool:
    """Whether environment variable ``name`` is set to a true word (1, true, yes, on)."""
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def startup_timeout_s() -> float:
    """Seconds to wait for a broker to answer (``THROUGHLINE_KAFKA_STARTUP_TIMEOUT``, default 90)."""
    return _env_float(ENV_STARTUP_TIMEOUT, DEFAULT_STARTUP_TIMEOUT_S)


def read_resource(name: str) -> str:
    """The text of one of this package's data files."""
    return resources.files(_PACKAGE).joinpath(name).read_text(encoding="utf-8")
