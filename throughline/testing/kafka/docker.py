"""The docker provider: ``apache/kafka`` as a single KRaft node in a container, through testcontainers."""

from __future__ import annotations

import contextlib
import os
import time
import urllib.parse
from typing import Any

from throughline.testing.kafka.admin import wait_for_kafka
from throughline.testing.kafka.config import (
    DEFAULT_STOP_TIMEOUT_S,
    DOCKER_IMAGE,
    LOOPBACK,
    Reporter,
    stderr_reporter,
)
from throughline.testing.kafka.exceptions import HarnessError
from throughline.testing.kafka.handle import discard_live, register_live
from throughline.testing.kafka.support import free_port, random_cluster_id


def _docker_host() -> str | None:
    try:
        from testcontainers.core.docker_client import get_docker_host
    except Exception:
        return os.environ.get("DOCKER_HOST") or None
    try:
        host: str | None = get_docker_host()
    except Exception:
        return None
    return host


def docker_available(timeout_s: float = 2.0) -> bool:
    """True if a Docker engine answers a ping within ``timeout_s``. Silent and fast without one."""
    try:
        import docker
    except ImportError:
        return False
    try:
        host = _docker_host()
        if host:
            client = docker.DockerClient(base_url=host, timeout=max(1, int(timeout_s)))
        else:
            client = docker.from_env(timeout=max(1, int(timeout_s)))
    except Exception:
        return False
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        with contextlib.suppress(Exception):
            client.close()


def _docker_advertised_host() -> tuple[str, str | None]:
    """(host clients use, host IP to publish on). Loopback for a local engine."""
    host = _docker_host() or ""
    scheme = urllib.parse.urlparse(host).scheme if host else ""
    if scheme in ("", "unix", "npipe"):
        return LOOPBACK, LOOPBACK
    hostname = urllib.parse.urlparse(host).hostname or LOOPBACK
    return hostname, None


class DockerKafka:
    """``apache/kafka:4.1.0`` as a single KRaft node in Docker, via testcontainers.

    The host port is chosen before the container starts so that the advertised listener is
    right from the first boot and stays the same across :meth:`restart`.
    """

    provider = "docker"
    CONTAINER_PORT = 9092

    def __init__(
        self,
        image: str = DOCKER_IMAGE,
        *,
        host_port: int = 0,
        startup_timeout_s: float | None = None,
        report: Reporter | None = None,
    ) -> None:
        """Configure the container; nothing starts until :meth:`start`."""
        self.image = image
        self._host_port = host_port
        self._timeout_s = startup_timeout_s
        self._report = report or stderr_reporter
        self._container: Any = None
        self._advertised_host, self._bind_ip = _docker_advertised_host()
        self._cluster_id = random_cluster_id()
        self.last_startup_s: float | None = None

    @property
    def supports_restart(self) -> bool:
        return True

    @property
    def bootstrap_servers(self) -> str:
        if not self._host_port:
            raise HarnessError("container has no port yet: call start() first")
        return f"{self._advertised_host}:{self._host_port}"

    def describe(self) -> str:
        cid = ""
        if self._container is not None:
            with contextlib.suppress(Exception):
                cid = f", container {self._container.get_wrapped_container().short_id}"
        return f"Docker {self.image} at {self.bootstrap_servers}{cid}"

    def environment(self) -> dict[str, str]:
        """The container's environment: Kafka's own single-node KRaft example, one replica everywhere."""
        return {
            "KAFKA_NODE_ID": "1",
            "KAFKA_PROCESS_ROLES": "broker,controller",
            "KAFKA_LISTENERS": "CONTROLLER://:29093,PLAINTEXT_HOST://:9092,PLAINTEXT://:19092",
            "KAFKA_ADVERTISED_LISTENERS": (
                f"PLAINTEXT_HOST://{self._advertised_host}:{self._host_port},PLAINTEXT://localhost:19092"
            ),
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,PLAINTEXT_HOST:PLAINTEXT",
            "KAFKA_INTER_BROKER_LISTENER_NAME": "PLAINTEXT",
            "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
            "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:29093",
            "CLUSTER_ID": self._cluster_id,
            "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
            "KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS": "1",
            "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
            "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
            "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
            "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1",
            "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
            "KAFKA_BROKER_HEARTBEAT_INTERVAL_MS": "500",
            "KAFKA_BROKER_SESSION_TIMEOUT_MS": "3000",
            "KAFKA_NUM_PARTITIONS": "1",
            "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
            "KAFKA_LOG_DIRS": "/var/lib/kafka/data",
        }

    def __enter__(self) -> DockerKafka:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _is_alive(self) -> bool:
        try:
            wrapped = self._container.get_wrapped_container()
            wrapped.reload()
            return wrapped.status in ("created", "running", "restarting")
        except Exception:
            return False

    def _logs(self) -> str:
        try:
            out, err = self._container.get_logs()
            text = (out + err).decode("utf-8", errors="replace")
            return "--- container log (tail) ---\n" + "\n".join(text.splitlines()[-40:])
        except Exception as exc:
            return f"(no container logs: {exc})"

    def start(self) -> DockerKafka:
        """Start (or, after ``stop(keep_data=True)``, resume) the container and wait until ready."""
        from testcontainers.core.container import DockerContainer

        started = time.monotonic()
        if self._container is None:
            if not self._host_port:
                self._host_port = free_port()
            container = DockerContainer(self.image)
            for key, value in self.environment().items():
                container.with_env(key, value)
            # docker-py accepts (ip, port) to publish on one address; testcontainers' own
            # with_bind_ports() only takes a port, so set the mapping directly.
            ports: dict[str, Any] = container.ports
            ports[f"{self.CONTAINER_PORT}/tcp"] = (
                (self._bind_ip, self._host_port) if self._bind_ip else self._host_port
            )
            self._report(f"starting {self.image} in Docker on port {self._host_port} ...")
            container.start()
            self._container = container
            register_live(self)
        elif not self._is_alive():
            self._container.get_wrapped_container().start()
        try:
            wait_for_kafka(
                self.bootstrap_servers,
                timeout_s=self._timeout_s,
                is_alive=self._is_alive,
                diagnostics=self._logs,
            )
        except BaseException:
            self.close()
            raise
        self.last_startup_s = time.monotonic() - started
        return self

    def stop(
        self, *, keep_data: bool = False, graceful: bool = True, timeout_s: float = DEFAULT_STOP_TIMEOUT_S
    ) -> None:
        """Stop the container; with ``keep_data`` it stays (stopped) so :meth:`start` resumes it."""
        if self._container is None:
            return
        if keep_data:
            wrapped = self._container.get_wrapped_container()
            if graceful:
                wrapped.stop(timeout=int(timeout_s))
            else:
                wrapped.kill()
            return
        with contextlib.suppress(Exception):
            self._container.stop()
        self._container = None
        discard_live(self)

    def kill(self) -> None:
        """Crash the broker (SIGKILL), keeping the container and its data."""
        self.stop(keep_data=True, graceful=False)

    def restart(self, *, graceful: bool = True) -> None:
        """Stop and start the same container: same data volume, same host port."""
        self.stop(keep_data=True, graceful=graceful)
        self.start()

    def close(self) -> None:
        """Remove the container and its anonymous volumes."""
        self.stop(keep_data=False)
