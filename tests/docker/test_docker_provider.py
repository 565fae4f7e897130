"""The harness's docker provider on a real engine (the docker tier: scripts/test-docker runs it).

The session broker and the private brokers are containers of ``THROUGHLINE_KAFKA_IMAGE`` on the host
network, bound to 127.0.0.1; ``auto`` falls back to the JVM broker with one line when the engine
cannot run the image, ``docker`` forced fails with the reason, and a failing test's report carries
the broker's log.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from throughline.testing.kafka import (
    DockerKafka,
    DockerUnavailableError,
    KafkaHandle,
    admin_client,
    create_topic,
)
from throughline.testing.kafka import provision as provision_module
from throughline.testing.kafka.docker import TAG_LABEL, docker_client, kafka_image
from throughline.testing.kafka.provision import provision_kafka, provision_private_kafka

REPO = Path(__file__).resolve().parents[2]
MISSING_IMAGE = "throughline-test/no-such-kafka:0"


@pytest.fixture
def engine() -> Iterator[Any]:
    with contextlib.closing(docker_client()) as client:
        yield client


@pytest.fixture
def fresh_fallback_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget which images this process already failed to run (auto asks once per image)."""
    monkeypatch.setattr(provision_module, "_DOCKER_FAILED", {})


def _listeners(value: str) -> dict[str, str]:
    return dict(item.split("://", 1) for item in value.split(","))


def test_the_session_broker_is_a_container_of_the_chosen_image_on_loopback(
    kafka_broker: KafkaHandle, engine: Any
) -> None:
    assert os.environ.get("THROUGHLINE_KAFKA_PROVIDER") == "docker"
    assert kafka_broker.provider == "docker"
    assert isinstance(kafka_broker, DockerKafka)
    assert kafka_broker.image == kafka_image() == os.environ["THROUGHLINE_KAFKA_IMAGE"]
    info = engine.containers.get(kafka_broker.container_id).attrs
    assert info["HostConfig"]["NetworkMode"] == "host"
    assert info["Config"]["Labels"][TAG_LABEL] == os.environ["THROUGHLINE_HARNESS_TAG"]
    env = dict(item.split("=", 1) for item in info["Config"]["Env"])
    for name in ("KAFKA_LISTENERS", "KAFKA_ADVERTISED_LISTENERS"):
        addresses = _listeners(env[name]).values()
        assert all(address.startswith("127.0.0.1:") for address in addresses), env[name]
    assert kafka_broker.bootstrap_servers == _listeners(env["KAFKA_ADVERTISED_LISTENERS"])["PLAINTEXT_HOST"]


def test_a_private_broker_is_its_own_container_survives_a_kill_and_goes_with_its_volume(
    kafka_broker: KafkaHandle, kafka_broker_factory: Any, engine: Any
) -> None:
    broker = kafka_broker_factory()
    assert broker.provider == "docker" and broker.container_id != getattr(kafka_broker, "container_id", None)
    cid = broker.container_id
    volumes = [m["Name"] for m in engine.containers.get(cid).attrs["Mounts"] if m["Type"] == "volume"]
    assert volumes, "the image's data volume should be mounted"
    create_topic(broker.bootstrap_servers, "survives-kill", partitions=1)
    broker.kill()
    assert engine.containers.get(cid).status == "exited"
    broker.start()
    assert engine.containers.get(cid).status == "running"
    admin = admin_client(broker.bootstrap_servers, 30.0)
    try:
        assert "survives-kill" in admin.list_topics()  # the data volume survived the crash
    finally:
        admin.close()
    broker.close()
    assert not engine.containers.list(all=True, filters={"id": cid})
    assert not [v for v in engine.volumes.list() if v.name in volumes]


def test_auto_falls_back_to_the_jvm_broker_with_one_clear_line(
    monkeypatch: pytest.MonkeyPatch, fresh_fallback_memory: None
) -> None:
    monkeypatch.setenv("THROUGHLINE_KAFKA_IMAGE", MISSING_IMAGE)
    lines: list[str] = []
    first = provision_kafka(provider="auto", report=lines.append)
    try:
        assert first.provider == "jvm"
    finally:
        first.close()
    # The next broker of the process does not try the image again, and says nothing more.
    assert provision_module._docker_or_none("auto", lines.append, None) is None
    said = [line for line in lines if "falling back" in line]
    assert len(said) == 1, lines
    assert MISSING_IMAGE in said[0] and "could not be pulled" in said[0] and "JVM" in said[0]


def test_forced_docker_fails_with_the_reason(monkeypatch: pytest.MonkeyPatch, fresh_fallback_memory: None) -> None:
    monkeypatch.setenv("THROUGHLINE_KAFKA_IMAGE", MISSING_IMAGE)
    with pytest.raises(
        DockerUnavailableError, match=r"no-such-kafka:0 is not on the Docker engine and could not be pulled"
    ):
        provision_kafka(provider="docker", report=lambda _: None)
    with pytest.raises(DockerUnavailableError, match="could not be pulled"):
        provision_private_kafka(provider="docker", report=lambda _: None)  # forced: asks again, fails again


def test_forced_docker_without_an_engine_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(DockerUnavailableError, match="no Docker engine answered"):
        provision_kafka(provider="docker", report=lambda _: None)


def test_a_failing_test_reports_its_brokers_log(tmp_path: Path) -> None:
    """The plugin adds the tail of the container's log to a failed test's report."""
    test_file = tmp_path / "test_fails_on_purpose.py"
    test_file.write_text(
        textwrap.dedent(
            """
            def test_fails(kafka_broker_factory):
                broker = kafka_broker_factory()
                assert broker.provider == "docker"
                assert False, "failing on purpose"
            """
        ),
        encoding="utf-8",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(test_file)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "failing on purpose" in out
    assert "throughline kafka: private broker Docker" in out, out[-3000:]
    assert "--- log of container" in out
    assert "] INFO " in out  # the broker's own log lines, not just a header
