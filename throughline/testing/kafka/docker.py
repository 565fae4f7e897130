"""The docker provider: a Kafka image (``apache/kafka`` by default) as a single KRaft node, through testcontainers.

The image is ``THROUGHLINE_KAFKA_IMAGE`` or the official ``apache/kafka:4.1.0``; any image that follows
Apache Kafka's ``KAFKA_*`` environment conventions works (``scripts/docker-images`` builds
``throughline-kafka:4.1.0`` from Maven Central jars for machines that cannot pull).

Networking: with an engine on this machine (a unix socket, on Linux) the container shares the host's
network and its listeners bind 127.0.0.1 only, so nothing but loopback traffic exists and an engine
without a bridge (``dockerd --bridge=none``) works. Elsewhere (a remote ``DOCKER_HOST``, Docker Desktop)
it runs on the default bridge with its port published. ``THROUGHLINE_DOCKER_NETWORK=host|bridge``
chooses explicitly.

Every container carries the labels ``dev.throughline.harness=kafka`` and
``dev.throughline.harness.tag=$THROUGHLINE_HARNESS_TAG``, so a script can find (and remove) exactly the
ones its run started. testcontainers' Ryuk reaper needs its own image from a registry: where there is
none, set ``TESTCONTAINERS_RYUK_DISABLED=true`` (the harness removes its containers itself, at close and
at interpreter exit).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import urllib.parse
from typing import Any

from throughline.testing.kafka.admin import wait_for_kafka
from throughline.testing.kafka.config import (
    DEFAULT_STOP_TIMEOUT_S,
    DOCKER_IMAGE,
    ENV_DOCKER_NETWORK,
    ENV_HARNESS_TAG,
    ENV_KAFKA_IMAGE,
    LOOPBACK,
    Reporter,
    stderr_reporter,
)
from throughline.testing.kafka.exceptions import DockerUnavailableError, HarnessError
from throughline.testing.kafka.handle import OwnedBroker, closed_on_failure, discard_live, register_live
from throughline.testing.kafka.support import free_port, free_ports, random_cluster_id

HARNESS_LABEL = "dev.throughline.harness"
TAG_LABEL = "dev.throughline.harness.tag"
NETWORK_MODES = ("host", "bridge")


def kafka_image() -> str:
    """The Kafka image the docker provider (and compose.yaml) runs: ``THROUGHLINE_KAFKA_IMAGE`` or the official one."""
    return os.environ.get(ENV_KAFKA_IMAGE, "").strip() or DOCKER_IMAGE


def docker_host() -> str | None:
    """The engine testcontainers talks to (``DOCKER_HOST``, testcontainers' properties, the docker context)."""
    try:
        from testcontainers.core.docker_client import get_docker_host
    except Exception:
        return os.environ.get("DOCKER_HOST") or None
    try:
        host: str | None = get_docker_host()
    except Exception:
        return None
    return host


def _engine_is_local(host: str | None) -> bool:
    scheme = urllib.parse.urlparse(host).scheme if host else ""
    return scheme in ("", "unix")


def docker_network_mode() -> str:
    """``host`` for an engine on this Linux machine, else ``bridge``; ``THROUGHLINE_DOCKER_NETWORK`` overrides."""
    configured = os.environ.get(ENV_DOCKER_NETWORK, "").strip().lower()
    if configured:
        if configured not in NETWORK_MODES:
            raise HarnessError(f"{ENV_DOCKER_NETWORK}={configured!r}: expected host or bridge")
        return configured
    return "host" if sys.platform.startswith("linux") and _engine_is_local(docker_host()) else "bridge"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def docker_client(timeout_s: float = 10.0) -> Any:
    """A docker-py client on :func:`docker_host` (raises when docker-py is missing or the address is bad)."""
    import docker

    host = docker_host()
    if host:
        return docker.DockerClient(base_url=host, timeout=max(1, int(timeout_s)))
    return docker.from_env(timeout=max(1, int(timeout_s)))


def docker_unavailable_reason(timeout_s: float = 2.0) -> str | None:
    """None if a Docker engine answers a ping within ``timeout_s``, else why not. Fast without one."""
    try:
        import docker  # noqa: F401
    except ImportError:
        return "docker-py is not installed (pip install 'throughline[test]')"
    try:
        client = docker_client(timeout_s)  # docker-py asks the engine for its API version here
    except Exception as exc:
        return f"no Docker engine answered at {docker_host() or 'the default socket'} ({_first_line(exc)})"
    try:
        if client.ping():
            return None
        return f"the Docker engine at {docker_host() or 'the default socket'} did not answer a ping"
    except Exception as exc:
        return f"no Docker engine answered at {docker_host() or 'the default socket'} ({_first_line(exc)})"
    finally:
        with contextlib.suppress(Exception):
            client.close()


def docker_available(timeout_s: float = 2.0) -> bool:
    """True if a Docker engine answers a ping within ``timeout_s``. Silent and fast without one."""
    return docker_unavailable_reason(timeout_s) is None


def ensure_image(image: str, *, report: Reporter | None = None, timeout_s: float = 300.0) -> None:
    """Make sure the engine has ``image``: present already, or pulled now.

    Raises :class:`DockerUnavailableError` saying why when it is neither (no registry, no network, no
    such image), which is what makes ``auto`` fall back to the JVM broker.
    """
    import docker.errors
    from docker.utils import parse_repository_tag

    report = report or stderr_reporter
    client = docker_client(timeout_s)
    try:
        try:
            client.images.get(image)
            return
        except docker.errors.ImageNotFound:
            pass
        repository, tag = parse_repository_tag(image)
        report(f"pulling {image} ...")
        try:
            client.images.pull(repository, tag=tag or "latest")
        except Exception as exc:
            raise DockerUnavailableError(
                f"image {image} is not on the Docker engine and could not be pulled ({_first_line(exc)}); "
                f"build a local one with scripts/docker-images and set {ENV_KAFKA_IMAGE}=throughline-kafka:4.1.0"
            ) from exc
    except docker.errors.DockerException as exc:
        raise DockerUnavailableError(f"the Docker engine could not look up image {image}: {_first_line(exc)}") from exc
    finally:
        with contextlib.suppress(Exception):
            client.close()


def _bridge_addresses() -> tuple[str, str | None]:
    """(host clients use, host IP to publish on) for a bridge network: loopback for a local engine."""
    host = docker_host() or ""
    if _engine_is_local(host) or urllib.parse.urlparse(host).scheme == "npipe":
        return LOOPBACK, LOOPBACK
    return urllib.parse.urlparse(host).hostname or LOOPBACK, None


def harness_labels(kind: str) -> dict[str, str]:
    """The labels that let a script find this run's containers (``kind``: ``kafka``, ``throughline``)."""
    return {
        HARNESS_LABEL: kind,
        TAG_LABEL: os.environ.get(ENV_HARNESS_TAG, "").strip(),
        f"{HARNESS_LABEL}.pid": str(os.getpid()),
    }


def run_container(
    image: str,
    *,
    environment: dict[str, str],
    network: str,
    labels: dict[str, str],
    command: list[str] | None = None,
    publish: tuple[int, str | None, int] | None = None,
) -> Any:
    """Start a testcontainers ``DockerContainer``: on the host network, or on a bridge publishing
    ``publish`` = (container port, host IP or None for all, host port). Raises
    :class:`DockerUnavailableError` saying why when the engine does not start it."""
    from testcontainers.core.container import DockerContainer

    container = DockerContainer(image)
    for key, value in environment.items():
        container.with_env(key, value)
    if command is not None:
        container.with_command(command)
    if network == "host":
        container.with_kwargs(network_mode="host", labels=labels)
    else:
        if publish is not None:
            # docker-py accepts (ip, port) to publish on one address; testcontainers' own
            # with_bind_ports() only takes a port, so set the mapping directly.
            inner, ip, outer = publish
            ports: dict[str, Any] = container.ports
            ports[f"{inner}/tcp"] = (ip, outer) if ip else outer
        container.with_kwargs(labels=labels)
    try:
        container.start()
    except Exception as exc:
        with contextlib.suppress(Exception):
            container.stop()
        hint = ""
        if "ryuk" in str(exc).lower():
            hint = "; testcontainers' Ryuk reaper needs its own image: set TESTCONTAINERS_RYUK_DISABLED=true"
        raise DockerUnavailableError(f"could not start a container from {image}: {_first_line(exc)}{hint}") from exc
    return container


def container_running(container: Any) -> bool:
    """Whether a started container still exists and runs."""
    try:
        wrapped = container.get_wrapped_container()
        wrapped.reload()
        return wrapped.status in ("created", "running", "restarting")
    except Exception:
        return False


def container_log_tail(container: Any, title: str, lines: int = 40) -> str:
    """The last ``lines`` lines of a container's output under a ``--- title ---`` header."""
    if container is None:
        return "(no container)"
    try:
        out, err = container.get_logs()
    except Exception as exc:
        return f"(no container logs: {exc})"
    text = (out + err).decode("utf-8", errors="replace")
    return f"--- {title} (tail) ---\n" + "\n".join(text.splitlines()[-lines:])


class DockerKafka(OwnedBroker):
    """A Kafka image as a single KRaft node in Docker, via testcontainers.

    The ports are chosen before the container starts, so the advertised listener is right from the first
    boot and stays the same across :meth:`restart`; the data lives in the container's volume
    (``/var/lib/kafka/data``), kept by :meth:`stop` (``keep_data=True``) and :meth:`kill`, removed by
    :meth:`close`.
    """

    provider = "docker"
    CONTAINER_PORT = 9092

    def __init__(
        self,
        image: str | None = None,
        *,
        host_port: int = 0,
        network: str | None = None,
        startup_timeout_s: float | None = None,
        heap_opts: str = "-Xms256m -Xmx512m",
        report: Reporter | None = None,
    ) -> None:
        """Configure the container; nothing starts until :meth:`start`.

        ``image`` defaults to :func:`kafka_image`, ``network`` to :func:`docker_network_mode`.
        """
        self.image = image or kafka_image()
        self.network = network or docker_network_mode()
        if self.network not in NETWORK_MODES:
            raise HarnessError(f"network {self.network!r}: expected host or bridge")
        self._host_port = host_port
        self._internal_port = 0
        self._controller_port = 0
        self._timeout_s = startup_timeout_s
        self._heap_opts = heap_opts
        self._report = report or stderr_reporter
        self._container: Any = None
        self._advertised_host: str
        self._bind_ip: str | None
        if self.network == "host":
            self._advertised_host, self._bind_ip = LOOPBACK, LOOPBACK
        else:
            self._advertised_host, self._bind_ip = _bridge_addresses()
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

    @property
    def container_id(self) -> str | None:
        """The container's id once started (None before)."""
        if self._container is None:
            return None
        with contextlib.suppress(Exception):
            return str(self._container.get_wrapped_container().id)
        return None

    def describe(self) -> str:
        cid = ""
        if self._container is not None:
            with contextlib.suppress(Exception):
                cid = f", container {self._container.get_wrapped_container().short_id}"
        return f"Docker {self.image} ({self.network} network) at {self.bootstrap_servers}{cid}"

    def _pick_ports(self) -> None:
        if self.network == "host":
            wanted = [p for p in (self._host_port, self._internal_port, self._controller_port) if not p]
            picked = iter(free_ports(len(wanted))) if wanted else iter(())
            self._host_port = self._host_port or next(picked)
            self._internal_port = self._internal_port or next(picked)
            self._controller_port = self._controller_port or next(picked)
        else:
            self._host_port = self._host_port or free_port()
            self._internal_port, self._controller_port = 19092, 29093

    def environment(self) -> dict[str, str]:
        """The container's environment: Kafka's own single-node KRaft example, one replica everywhere.

        On the host network every listener binds 127.0.0.1 on a port of its own; on a bridge the
        container listens on all of its interfaces and only the client port is published (on loopback
        for a local engine).
        """
        if not self._host_port or not self._controller_port:
            self._pick_ports()
        if self.network == "host":
            ip = LOOPBACK
            listeners = (
                f"CONTROLLER://{ip}:{self._controller_port},PLAINTEXT_HOST://{ip}:{self._host_port},"
                f"PLAINTEXT://{ip}:{self._internal_port}"
            )
            advertised = f"PLAINTEXT_HOST://{ip}:{self._host_port},PLAINTEXT://{ip}:{self._internal_port}"
            voters = f"1@{ip}:{self._controller_port}"
        else:
            listeners = (
                f"CONTROLLER://:{self._controller_port},PLAINTEXT_HOST://:{self.CONTAINER_PORT},"
                f"PLAINTEXT://:{self._internal_port}"
            )
            advertised = (
                f"PLAINTEXT_HOST://{self._advertised_host}:{self._host_port},"
                f"PLAINTEXT://localhost:{self._internal_port}"
            )
            voters = f"1@localhost:{self._controller_port}"
        return {
            "KAFKA_NODE_ID": "1",
            "KAFKA_PROCESS_ROLES": "broker,controller",
            "KAFKA_LISTENERS": listeners,
            "KAFKA_ADVERTISED_LISTENERS": advertised,
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,PLAINTEXT_HOST:PLAINTEXT",
            "KAFKA_INTER_BROKER_LISTENER_NAME": "PLAINTEXT",
            "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
            "KAFKA_CONTROLLER_QUORUM_VOTERS": voters,
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
            # Not a broker property (the image's scripts leave *_OPTS out): a small heap for a test node.
            "KAFKA_HEAP_OPTS": self._heap_opts,
        }

    def labels(self) -> dict[str, str]:
        """The labels that let a script find this run's containers."""
        return harness_labels("kafka")

    def __enter__(self) -> DockerKafka:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def is_running(self) -> bool:
        """Whether the container exists and runs (Kafka in it may not be ready yet)."""
        return container_running(self._container)

    def diagnostics(self, lines: int = 40) -> str:
        """The tail of the container's log (Kafka logs to stdout in the image), for error messages."""
        return container_log_tail(self._container, f"log of container {self.container_id or '?'} ({self.image})", lines)

    def start(self) -> DockerKafka:
        """Start (or, after ``stop(keep_data=True)``, resume) the container and wait until ready.

        Raises :class:`DockerUnavailableError` when the image cannot be had or the container cannot be
        created, and :class:`BrokerStartError` (with the container's log) when Kafka in it never answers.
        """
        started = time.monotonic()
        if self._container is None:
            self._create()
        elif not self.is_running():
            self._container.get_wrapped_container().start()
        with closed_on_failure(self):
            wait_for_kafka(
                self.bootstrap_servers,
                timeout_s=self._timeout_s,
                is_alive=self.is_running,
                diagnostics=self.diagnostics,
            )
        self.last_startup_s = time.monotonic() - started
        return self

    def _create(self) -> None:
        ensure_image(self.image, report=self._report)
        self._pick_ports()
        self._report(f"starting {self.image} in Docker ({self.network} network) on port {self._host_port} ...")
        self._container = run_container(
            self.image,
            environment=self.environment(),
            network=self.network,
            labels=self.labels(),
            publish=(self.CONTAINER_PORT, self._bind_ip, self._host_port),
        )
        register_live(self)

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
                # docker kill returns once the signal is sent; wait (bounded) until the container is down.
                with contextlib.suppress(Exception):
                    wrapped.wait(timeout=int(timeout_s))
            return
        with contextlib.suppress(Exception):
            self._container.stop()  # removes the container and its anonymous volumes
        self._container = None
        discard_live(self)
