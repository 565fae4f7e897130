"""throughline in a container, for a user's own integration suite (testcontainers).

:class:`ThroughlineContainer` runs ``throughline serve`` (the projector and the HTTP read API) from the
project's Dockerfile image next to a Kafka broker: the harness's session broker, a
:class:`~throughline.testing.kafka.DockerKafka`, or any ``host:port``. A test appends turns with
:meth:`~ThroughlineContainer.append` and reads what an Observer would see with
:meth:`~ThroughlineContainer.read`, over HTTP with the container's bearer token::

    def test_my_turns_are_served(throughline_container):
        tl = throughline_container
        tl.append(project="demo", host="h", thread="t", turn_id="1", completed_at="2025-01-01T00:00:00Z", body="hi")
        page = tl.read("demo")
        assert page.status == "ok" and [t.body for t in page.turns] == ["hi"]

The image is ``THROUGHLINE_IMAGE`` or ``throughline:local`` (``docker build -t throughline:local .`` in
a checkout; ``scripts/docker-images throughline`` builds it on a local Debian base where the official
Python image cannot be pulled). Networking follows the Kafka harness
(:func:`~throughline.testing.kafka.docker.docker_network_mode`): on the host network serve binds
127.0.0.1 on a free port; on a bridge it binds 0.0.0.0 in its container, published on loopback, and
needs ``container_bootstrap_servers`` that the container can reach.

The pytest fixtures ``throughline_container`` (one per session, on the session broker, its own topic)
and ``throughline_container_factory`` (one per call, closed after the test) are in
:mod:`throughline.testing.pytest_plugin`.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
import urllib.error
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from throughline.testing.kafka.config import LOOPBACK, Reporter, stderr_reporter
from throughline.testing.kafka.docker import (
    container_log_tail,
    container_running,
    docker_network_mode,
    ensure_image,
    harness_labels,
    run_container,
)
from throughline.testing.kafka.exceptions import DockerUnavailableError, HarnessError
from throughline.testing.kafka.handle import KafkaHandle, closed_on_failure, discard_live, register_live
from throughline.testing.kafka.support import free_port

ENV_IMAGE = "THROUGHLINE_IMAGE"
DEFAULT_IMAGE = "throughline:local"
CONTAINER_PORT = 8787
DEFAULT_STARTUP_TIMEOUT_S = 120.0
DEFAULT_READ_TIMEOUT_S = 30.0

__all__ = ["DEFAULT_IMAGE", "ENV_IMAGE", "ThroughlineContainer", "throughline_image"]


def throughline_image() -> str:
    """The image :class:`ThroughlineContainer` runs: ``THROUGHLINE_IMAGE`` or ``throughline:local``."""
    return os.environ.get(ENV_IMAGE, "").strip() or DEFAULT_IMAGE


class ThroughlineContainer:
    """``throughline serve`` in a container, next to a Kafka broker; a context manager.

    ``kafka`` is a :class:`~throughline.testing.kafka.KafkaHandle` (the ``kafka_broker`` fixture) or
    ``host:port``; ``topic`` defaults to a fresh unique name (serve creates it). ``auth_token``
    defaults to a random one; :meth:`reader` and :meth:`read` send it.
    """

    def __init__(
        self,
        kafka: KafkaHandle | str,
        *,
        image: str | None = None,
        topic: str | None = None,
        auth_token: str | None = None,
        network: str | None = None,
        container_bootstrap_servers: str | None = None,
        extra_args: Iterable[str] = (),
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        report: Reporter | None = None,
    ) -> None:
        """Configure the container; nothing starts until :meth:`start`."""
        self.bootstrap_servers = kafka if isinstance(kafka, str) else kafka.bootstrap_servers
        self.image = image or throughline_image()
        self.topic = topic or f"throughline.turns.{uuid.uuid4().hex[:12]}"
        self.auth_token = auth_token or secrets.token_urlsafe(24)
        self.network = network or docker_network_mode()
        if self.network == "bridge" and not container_bootstrap_servers:
            raise HarnessError(
                "on a bridge network the serve container cannot reach a broker on this machine's loopback: "
                "pass container_bootstrap_servers (an address the container reaches) or use the host network "
                "(THROUGHLINE_DOCKER_NETWORK=host)"
            )
        self._container_bootstrap = container_bootstrap_servers or self.bootstrap_servers
        self._extra_args = tuple(extra_args)
        self._startup_timeout_s = startup_timeout_s
        self._report = report or stderr_reporter
        self._port = 0
        self._container: Any = None

    # ------------------------------------------------------------------------------------------ facts

    @property
    def url(self) -> str:
        """The HTTP read API's base URL (on 127.0.0.1)."""
        if not self._port:
            raise HarnessError("the container has no port yet: call start() first")
        return f"http://{LOOPBACK}:{self._port}"

    def describe(self) -> str:
        """One line: image, network, URL, topic and broker."""
        where = self.url if self._port else "(not started)"
        return f"{self.image} serve at {where} ({self.network} network), topic {self.topic} on {self.bootstrap_servers}"

    def environment(self) -> dict[str, str]:
        """The container's environment: where the log is, and the bearer token."""
        return {
            "THROUGHLINE_BOOTSTRAP_SERVERS": self._container_bootstrap,
            "THROUGHLINE_TOPIC": self.topic,
            "THROUGHLINE_AUTH_TOKEN": self.auth_token,
        }

    def command(self) -> list[str]:
        """``serve`` with its address: loopback on the host network, all interfaces in a bridge's container."""
        if self.network == "host":
            address = ["--host", LOOPBACK, "--port", str(self._port)]
        else:
            address = ["--host", "0.0.0.0", "--port", str(CONTAINER_PORT)]
        return ["serve", *address, *self._extra_args]

    # ------------------------------------------------------------------------------------------ lifecycle

    def __enter__(self) -> ThroughlineContainer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> ThroughlineContainer:
        """Start serve and wait (bounded) until ``/readyz`` answers; raises with the container's log if not."""
        try:
            ensure_image(self.image, report=self._report)
        except DockerUnavailableError as exc:
            raise DockerUnavailableError(
                f"{exc}; build the project's image first: docker build -t {DEFAULT_IMAGE} . "
                f"(or scripts/docker-images throughline), or set {ENV_IMAGE}"
            ) from exc
        self._port = free_port()
        self._report(f"starting {self.image} (throughline serve) on {self.url}, topic {self.topic} ...")
        self._container = run_container(
            self.image,
            environment=self.environment(),
            network=self.network,
            labels=harness_labels("throughline"),
            command=self.command(),
            publish=(CONTAINER_PORT, LOOPBACK, self._port),
        )
        register_live(self)
        with closed_on_failure(self):
            self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self._startup_timeout_s
        last = "no answer yet"
        reader = self.reader(timeout=5.0)
        for _ in range(10_000):
            if time.monotonic() >= deadline:
                break
            if not container_running(self._container):
                raise HarnessError(f"throughline serve exited before it answered:\n{self.diagnostics()}")
            try:
                status, body = reader.get_json("/readyz")
                if status == 200:
                    return
                last = f"/readyz answered {status}: {body}"
            except Exception as exc:  # not listening yet
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.25)
        raise HarnessError(
            f"throughline serve was not ready after {self._startup_timeout_s:.0f}s ({last}):\n{self.diagnostics()}"
        )

    def diagnostics(self, lines: int = 40) -> str:
        """The tail of serve's log (its stderr), for error messages."""
        return container_log_tail(self._container, f"log of {self.image} (throughline serve)", lines)

    def close(self) -> None:
        """Stop serve (SIGTERM: it commits the batch in flight) and remove the container and its volume."""
        if self._container is None:
            return
        with contextlib.suppress(Exception):
            self._container.get_wrapped_container().stop(timeout=30)
        with contextlib.suppress(Exception):
            self._container.stop()
        self._container = None
        discard_live(self)

    # ------------------------------------------------------------------------------------------ using it

    def reader(self, *, timeout: float = DEFAULT_READ_TIMEOUT_S) -> Any:
        """A :class:`throughline.serve.client.HttpReader` on this container, with its token."""
        from throughline.serve.client import HttpReader

        return HttpReader(self.url, self.auth_token, timeout=timeout)

    def producer(self) -> Any:
        """A :class:`throughline.producers.TurnProducer` on the container's topic (close it when done)."""
        from throughline.producers import TurnProducer

        return TurnProducer(self.bootstrap_servers, self.topic)

    def append(self, **turn: Any) -> Any:
        """Append one completed turn to the container's topic; returns its log position.

        The keyword arguments are :meth:`TurnProducer.append`'s (``project``, ``host``, ``thread``,
        ``turn_id``, ``completed_at``, ``body``, optional ``seq`` and ``attributes``).
        """
        with contextlib.closing(self.producer()) as producer:
            return producer.append(**turn)

    def append_lines(self, turns: Iterable[Mapping[str, Any]]) -> list[Any]:
        """Append turns given as ``throughline ingest`` JSON Lines objects (``turnId``, ``completedAt``, ...),
        checked as ingest checks a line; returns their log positions."""
        from throughline.producers.ingest import parse_turn_line

        records = [parse_turn_line(json.dumps(dict(turn)), producer_name="throughline-testing") for turn in turns]
        with contextlib.closing(self.producer()) as producer:
            return producer.send_many([r for r in records if r is not None])

    def read(
        self,
        project: str,
        *,
        after_cursor: str | None = None,
        through_cursor: str | None = None,
        page_token: str | None = None,
        limit: int = 10,
        timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    ) -> Any:
        """One page of ``project`` (an :class:`~throughline.reader.wire.ObserverRead`) over HTTP.

        While the projector has not caught up the page is ``projection_pending``; this asks again
        (bounded by ``timeout_s``) and returns the first other answer, or the last pending one.
        """
        deadline = time.monotonic() + timeout_s
        reader = self.reader()
        page = None
        for _ in range(10_000):
            try:
                page = reader.read_observer_turn_page(
                    project=project,
                    after_cursor=after_cursor,
                    through_cursor=through_cursor,
                    page_token=page_token,
                    limit=limit,
                )
            except urllib.error.URLError:
                page = None
            if page is not None and page.status != "projection_pending":
                return page
            if time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if page is None:
            raise HarnessError(f"throughline serve at {self.url} did not answer reads:\n{self.diagnostics()}")
        return page
