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


def _service(compose: dict[str, Any], name: str) -> dict[str, Any]:
    services = compose.get("services") or {}
    assert name in services, f"no {name} service in {sorted(services)}"
    service: dict[str, Any] = services[name]
    return service


def _environment(service: dict[str, Any]) -> dict[str, str]:
    raw = service["environment"]
    if isinstance(raw, list):  # the "- KEY=value" form
        raw = dict(item.split("=", 1) for item in raw)
    return {str(k): str(v) for k, v in raw.items()}


@pytest.fixture(scope="module")
def kafka(compose: dict[str, Any]) -> dict[str, Any]:
    return _service(compose, "kafka")


@pytest.fixture(scope="module")
def serve(compose: dict[str, Any]) -> dict[str, Any]:
    return _service(compose, "throughline")


@pytest.fixture(scope="module")
def env(kafka: dict[str, Any]) -> dict[str, str]:
    return _environment(kafka)


@pytest.fixture(scope="module")
def serve_env(serve: dict[str, Any]) -> dict[str, str]:
    return _environment(serve)


def test_image_is_apache_kafka_4_unless_overridden(kafka: dict[str, Any]) -> None:
    """THROUGHLINE_KAFKA_IMAGE chooses the image; without it compose runs the official one."""
    image = kafka["image"]
    match = re.fullmatch(r"\$\{THROUGHLINE_KAFKA_IMAGE:-apache/kafka:(\d+)\.(\d+)\.(\d+)\}", image)
    assert match, f"expected ${{THROUGHLINE_KAFKA_IMAGE:-apache/kafka:X.Y.Z}}, got {image!r}"
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


def test_data_volume_and_healthcheck(compose: dict[str, Any], kafka: dict[str, Any], env: dict[str, str]) -> None:
    log_dir = env["KAFKA_LOG_DIRS"]
    mounts = [str(v).split(":") for v in kafka.get("volumes", [])]
    named = [m for m in mounts if len(m) >= 2 and m[1] == log_dir and not m[0].startswith((".", "/"))]
    assert named, f"the log dir {log_dir} should be a named volume: {kafka.get('volumes')}"
    assert named[0][0] in (compose.get("volumes") or {})
    test = kafka["healthcheck"]["test"]
    assert "9092" in " ".join(test if isinstance(test, list) else [test])


# ------------------------------------------------------------------------------------------ throughline serve

DOCKERFILE = COMPOSE.parent / "Dockerfile"


def test_serve_builds_from_the_repo_dockerfile(serve: dict[str, Any]) -> None:
    build = serve["build"]
    context = build if isinstance(build, str) else build.get("context", ".")
    dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
    assert (COMPOSE.parent / context / dockerfile).resolve() == DOCKERFILE.resolve()
    text = DOCKERFILE.read_text(encoding="utf-8")
    # The official Python image by default; compose passes THROUGHLINE_PYTHON_IMAGE through for a local one.
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim$", text, re.M)
    assert re.search(r"^FROM \$\{PYTHON_IMAGE\}$", text, re.M)
    assert build["args"]["PYTHON_IMAGE"] == "${THROUGHLINE_PYTHON_IMAGE:-python:3.11-slim}"
    assert re.search(r'^ENTRYPOINT \["throughline"\]', text, re.M)
    assert re.search(r'^CMD \["serve", "--host", "0\.0\.0\.0", "--insecure-http"\]', text, re.M)
    # Every folder the package is built from is copied into the image.
    for folder in ("throughline", "producers", "projector", "reader", "schemas"):
        assert re.search(rf"^COPY {folder} ", text, re.M), folder


def test_serve_waits_for_a_healthy_broker(serve: dict[str, Any]) -> None:
    depends = serve["depends_on"]
    assert isinstance(depends, dict) and depends["kafka"]["condition"] == "service_healthy"


def test_serve_uses_the_in_network_listener(serve_env: dict[str, str], env: dict[str, str]) -> None:
    advertised = _listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    bootstrap = serve_env["THROUGHLINE_BOOTSTRAP_SERVERS"]
    assert bootstrap in advertised.values(), (bootstrap, advertised)
    assert not bootstrap.startswith("localhost"), "inside the network, localhost is the container itself"
    name = next(n for n, address in advertised.items() if address == bootstrap)
    assert _listeners(env["KAFKA_LISTENERS"])[name].endswith(":" + bootstrap.rsplit(":", 1)[1])


def test_serve_keeps_its_projection_on_a_volume(
    compose: dict[str, Any], serve: dict[str, Any], serve_env: dict[str, str]
) -> None:
    db = serve_env["THROUGHLINE_DB"]
    mounts = [str(v).split(":") for v in serve.get("volumes", [])]
    named = [
        m for m in mounts if len(m) >= 2 and db.startswith(m[1].rstrip("/") + "/") and not m[0].startswith((".", "/"))
    ]
    assert named, f"{db} should live on a named volume: {serve.get('volumes')}"
    assert named[0][0] in (compose.get("volumes") or {})


def test_serve_binds_all_interfaces_only_with_a_token(serve: dict[str, Any], serve_env: dict[str, str]) -> None:
    command = serve.get("command") or ["serve", "--host", "0.0.0.0"]
    assert "THROUGHLINE_AUTH_TOKEN" in serve_env
    assert "0.0.0.0" in command
    published = [str(p) for p in serve["ports"]]
    assert any(p.startswith("127.0.0.1:") and p.endswith(":8787") for p in published), published


# ------------------------------------------------------------------------------------------ compose.host.yaml

HOST_OVERRIDE = COMPOSE.parent / "compose.host.yaml"


def test_host_override_binds_every_listener_to_loopback() -> None:
    """compose.host.yaml (the docker tier's engine has no bridge) keeps all traffic on 127.0.0.1."""
    data = yaml.safe_load(HOST_OVERRIDE.read_text(encoding="utf-8"))
    kafka_env = data["services"]["kafka"]["environment"]
    for service in ("kafka", "throughline"):
        assert data["services"][service]["network_mode"] == "host"
    listeners = _listeners(kafka_env["KAFKA_LISTENERS"])
    assert all(address.startswith("127.0.0.1:") for address in listeners.values()), listeners
    advertised = _listeners(kafka_env["KAFKA_ADVERTISED_LISTENERS"])
    assert all(address.startswith("127.0.0.1:") for address in advertised.values()), advertised
    serve = data["services"]["throughline"]
    assert serve["environment"]["THROUGHLINE_BOOTSTRAP_SERVERS"] == advertised["PLAINTEXT"]
    command = serve["command"]
    assert command[command.index("--host") + 1] == "127.0.0.1"
