"""compose.yaml runs a single-node KRaft Apache Kafka 4.x that clients reach at localhost:9092."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "compose.yaml"


def _listeners(value: str) -> dict[str, str]:
    """'NAME://host:port,...' -> {NAME: 'host:port'}."""
    out: dict[str, str] = {}
    for item in value.split(","):
        name, _, address = item.strip().partition("://")
        assert name and address, f"malformed listener {item!r}"
        out[name] = address
    return out


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def kafka(compose: dict[str, Any]) -> dict[str, Any]:
    services = compose.get("services") or {}
    assert "kafka" in services, f"no kafka service in {sorted(services)}"
    service: dict[str, Any] = services["kafka"]
    return service


@pytest.fixture(scope="module")
def env(kafka: dict[str, Any]) -> dict[str, str]:
    raw = kafka["environment"]
    if isinstance(raw, list):  # the "- KEY=value" form
        raw = dict(item.split("=", 1) for item in raw)
    return {str(k): str(v) for k, v in raw.items()}


def test_image_is_apache_kafka_4(kafka: dict[str, Any]) -> None:
    image = kafka["image"]
    match = re.fullmatch(r"apache/kafka:(\d+)\.(\d+)\.(\d+)", image)
    assert match, f"expected a pinned apache/kafka:X.Y.Z image, got {image!r}"
    assert int(match.group(1)) == 4


def test_kraft_combined_single_node(env: dict[str, str]) -> None:
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_NODE_ID"] == "1"
    assert "KAFKA_ZOOKEEPER_CONNECT" not in env
    voters = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")
    assert len(voters) == 1 and voters[0].startswith("1@")
    controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    listeners = _listeners(env["KAFKA_LISTENERS"])
    assert controller in listeners
    # The voter's port is the controller listener's port.
    assert voters[0].rsplit(":", 1)[1] == listeners[controller].rsplit(":", 1)[1]
    protocol_map = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(listeners) <= set(protocol_map)
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] in listeners
    # CLUSTER_ID must be a Kafka Uuid: 16 bytes, base64url without padding.
    assert len(base64.urlsafe_b64decode(env["CLUSTER_ID"] + "==")) == 16


def test_clients_reach_localhost_9092(kafka: dict[str, Any], env: dict[str, str]) -> None:
    advertised = _listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    host_listeners = [name for name, address in advertised.items() if address == "localhost:9092"]
    assert host_listeners, f"nothing advertised at localhost:9092: {advertised}"
    # ...and that listener really listens on container port 9092...
    assert _listeners(env["KAFKA_LISTENERS"])[host_listeners[0]].endswith(":9092")
    # ...which is published on the host's port 9092.
    published = []
    for port in kafka["ports"]:
        if isinstance(port, dict):
            published.append((str(port.get("published")), str(port.get("target"))))
        else:
            parts = str(port).split(":")
            published.append((parts[-2], parts[-1]))
    assert ("9092", "9092") in published, kafka["ports"]


def test_single_replica_internal_topics(env: dict[str, str]) -> None:
    for key in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    ):
        assert env.get(key) == "1", key
    assert env.get("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS") == "0"


def test_data_volume_and_healthcheck(
    compose: dict[str, Any], kafka: dict[str, Any], env: dict[str, str]
) -> None:
    log_dir = env["KAFKA_LOG_DIRS"]
    mounts = [str(v).split(":") for v in kafka.get("volumes", [])]
    named = [m for m in mounts if len(m) >= 2 and m[1] == log_dir and not m[0].startswith((".", "/"))]
    assert named, f"the log dir {log_dir} should be a named volume: {kafka.get('volumes')}"
    assert named[0][0] in (compose.get("volumes") or {})
    test = kafka["healthcheck"]["test"]
    assert "9092" in " ".join(test if isinstance(test, list) else [test])
