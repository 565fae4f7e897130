"""Choosing the docker provider's image and network, and the auto fallback, without an engine.

The docker tier (tests/docker, scripts/test-docker) runs all of it on a real engine; these pin the
decisions: THROUGHLINE_KAFKA_IMAGE over the official image, host networking for a local engine,
one line and the JVM broker when an answering engine cannot run the image, the reason raised when
docker is forced.
"""

from __future__ import annotations

from typing import Any

import pytest

from throughline.testing.kafka import DOCKER_IMAGE, DockerUnavailableError, HarnessError
from throughline.testing.kafka import docker as docker_module
from throughline.testing.kafka import provision as provision_module


def test_the_official_image_unless_throughline_kafka_image_says_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THROUGHLINE_KAFKA_IMAGE", raising=False)
    assert docker_module.kafka_image() == DOCKER_IMAGE == "apache/kafka:4.1.0"
    monkeypatch.setenv("THROUGHLINE_KAFKA_IMAGE", "throughline-kafka:4.1.0")
    assert docker_module.kafka_image() == "throughline-kafka:4.1.0"
    assert docker_module.DockerKafka(network="host").image == "throughline-kafka:4.1.0"


def test_network_mode_host_for_a_local_engine_bridge_for_a_remote_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THROUGHLINE_DOCKER_NETWORK", raising=False)
    monkeypatch.setattr(docker_module.sys, "platform", "linux")
    monkeypatch.setattr(docker_module, "docker_host", lambda: "unix:///tmp/x/docker.sock")
    assert docker_module.docker_network_mode() == "host"
    monkeypatch.setattr(docker_module, "docker_host", lambda: "tcp://10.0.0.5:2375")
    assert docker_module.docker_network_mode() == "bridge"
    monkeypatch.setenv("THROUGHLINE_DOCKER_NETWORK", "host")
    assert docker_module.docker_network_mode() == "host"
    monkeypatch.setenv("THROUGHLINE_DOCKER_NETWORK", "overlay")
    with pytest.raises(HarnessError, match="expected host or bridge"):
        docker_module.docker_network_mode()


class _FakeJvm:
    provider = "jvm"
    started = 0

    def __init__(self, **_: Any) -> None:
        pass

    def start(self, **_: Any) -> _FakeJvm:
        _FakeJvm.started += 1
        return self


@pytest.fixture
def engine_that_cannot_run_the_image(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    attempts: list[str] = []

    def refuse(self: Any) -> Any:
        attempts.append(self.image)
        raise DockerUnavailableError(
            f"image {self.image} is not on the Docker engine and could not be pulled (no such host)"
        )

    monkeypatch.setenv("THROUGHLINE_KAFKA_IMAGE", "example/kafka:9")
    monkeypatch.delenv("THROUGHLINE_TEST_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setattr(provision_module, "_DOCKER_FAILED", {})
    monkeypatch.setattr(provision_module, "docker_unavailable_reason", lambda: None)
    monkeypatch.setattr(provision_module.DockerKafka, "start", refuse)
    monkeypatch.setattr(provision_module, "KafkaBroker", _FakeJvm)
    return attempts


def test_auto_falls_back_once_with_one_line(engine_that_cannot_run_the_image: list[str]) -> None:
    lines: list[str] = []
    first = provision_module.provision_kafka(provider="auto", report=lines.append)
    second = provision_module.provision_private_kafka(provider="auto", report=lines.append)
    assert first.provider == second.provider == "jvm"
    assert engine_that_cannot_run_the_image == ["example/kafka:9"]  # the image is tried once per process
    assert len(lines) == 1
    assert lines[0].startswith("docker provider unavailable, falling back to the JVM broker: ")
    assert "example/kafka:9" in lines[0] and "could not be pulled" in lines[0]


def test_forced_docker_raises_the_reason(engine_that_cannot_run_the_image: list[str]) -> None:
    with pytest.raises(DockerUnavailableError, match="example/kafka:9 is not on the Docker engine"):
        provision_module.provision_kafka(provider="docker", report=lambda _: None)
    with pytest.raises(DockerUnavailableError, match="could not be pulled"):
        provision_module.provision_private_kafka(provider="docker", report=lambda _: None)


def test_forced_docker_without_an_engine_says_which(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THROUGHLINE_TEST_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setattr(provision_module, "docker_unavailable_reason", lambda: "no Docker engine answered at unix:///x")
    with pytest.raises(DockerUnavailableError, match="provider 'docker' was requested but no Docker engine answered"):
        provision_module.provision_kafka(provider="docker", report=lambda _: None)


def test_no_engine_under_auto_is_the_quiet_jvm_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THROUGHLINE_TEST_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setattr(provision_module, "docker_unavailable_reason", lambda: "no Docker engine answered")
    monkeypatch.setattr(provision_module, "KafkaBroker", _FakeJvm)
    lines: list[str] = []
    assert provision_module.provision_kafka(provider="auto", report=lines.append).provider == "jvm"
    assert lines == []
