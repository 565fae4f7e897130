"""Talking to a running broker: an admin client, the readiness wait, and topic creation."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from throughline.errors import ConfigurationError
from throughline.log import (
    PLAINTEXT,
    KafkaClientConfig,
    KafkaSecurityError,
    bootstrap_list,
    clients,
    resolve_kafka_config,
)
from throughline.testing.kafka.config import ENV_BOOTSTRAP, startup_timeout_s
from throughline.testing.kafka.exceptions import BrokerStartError, HarnessError
from throughline.testing.kafka.support import split_bootstrap, tcp_open


def client_config_for(bootstrap_servers: str) -> KafkaClientConfig:
    """How the harness reaches ``bootstrap_servers``: the external broker ``THROUGHLINE_TEST_BOOTSTRAP_SERVERS``
    names with ``THROUGHLINE_KAFKA_CONFIG``'s settings (a secured cluster), any broker the harness
    started itself with PLAINTEXT."""
    external = os.environ.get(ENV_BOOTSTRAP, "").strip()
    if external and bootstrap_list(external) == bootstrap_list(bootstrap_servers):
        return resolve_kafka_config()
    return PLAINTEXT


def admin_client(bootstrap_servers: str, timeout_s: float, kafka_config: KafkaClientConfig | None = None) -> Any:
    """A ``KafkaAdminClient`` with short timeouts, built like every throughline client
    (``throughline.log.clients``); ``kafka_config=None``: ``client_config_for(bootstrap_servers)``."""
    return clients.admin(
        bootstrap_list(bootstrap_servers),
        client_id="throughline-harness",
        connect_timeout=timeout_s,
        kafka_config=client_config_for(bootstrap_servers) if kafka_config is None else kafka_config,
        request_timeout_ms=max(1000, int(timeout_s * 1000)),
    )


def _probe(bootstrap_servers: str, timeout_s: float, kafka_config: KafkaClientConfig | None = None) -> int:
    """One readiness probe: describe the cluster and list topics. Returns the broker count."""
    admin = admin_client(bootstrap_servers, timeout_s, kafka_config)
    try:
        cluster = admin.describe_cluster()
        brokers = cluster.get("brokers") or []
        if not brokers:
            raise HarnessError("cluster has no registered brokers yet")
        admin.list_topics()
        return len(brokers)
    finally:
        admin.close()


def wait_for_kafka(
    bootstrap_servers: str,
    *,
    timeout_s: float | None = None,
    is_alive: Callable[[], bool] | None = None,
    diagnostics: Callable[[], str] | None = None,
    max_attempts: int = 2000,
    kafka_config: KafkaClientConfig | None = None,
) -> float:
    """Block until the broker at ``bootstrap_servers`` answers admin requests (with ``kafka_config``).

    Fails early (with ``diagnostics()``) if ``is_alive()`` turns false or the settings do not fit the
    listener (a wrong password never becomes right by waiting), and raises :class:`BrokerStartError`
    after ``timeout_s`` seconds or ``max_attempts`` probes. Returns the seconds waited.
    """
    timeout_s = startup_timeout_s() if timeout_s is None else timeout_s
    host, port = split_bootstrap(bootstrap_servers)
    started = time.monotonic()
    deadline = started + timeout_s
    last_error: str = "broker port not open yet"

    def _fail(reason: str) -> BrokerStartError:
        extra = diagnostics() if diagnostics else ""
        return BrokerStartError(f"Kafka at {bootstrap_servers} {reason}" + (f"\n{extra}" if extra else ""))

    for _ in range(max_attempts):
        if is_alive is not None and not is_alive():
            raise _fail("exited before it became ready")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        if tcp_open(host, port, min(1.0, remaining)):
            try:
                _probe(bootstrap_servers, min(5.0, max(1.0, remaining)), kafka_config)
                return time.monotonic() - started
            except (KafkaSecurityError, ConfigurationError) as exc:
                raise _fail(f"refused the client settings: {exc.code}: {exc.message}") from None
            except Exception as exc:  # any client error just means "not ready yet"
                last_error = f"{type(exc).__name__}: {exc}"
        time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
    raise _fail(f"was not ready after {time.monotonic() - started:.1f}s (last error: {last_error})")


def create_topic(
    bootstrap_servers: str,
    name: str,
    *,
    partitions: int = 1,
    replication_factor: int = 1,
    configs: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
    kafka_config: KafkaClientConfig | None = None,
) -> None:
    """Create topic ``name`` and wait (bounded) until every partition has a leader."""
    from kafka.admin import NewTopic

    admin = admin_client(bootstrap_servers, timeout_s, kafka_config)
    try:
        admin.create_topics(
            [
                NewTopic(
                    name=name,
                    num_partitions=partitions,
                    replication_factor=replication_factor,
                    topic_configs=dict(configs or {}),
                )
            ],
            timeout_ms=int(timeout_s * 1000),
        )
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            try:
                topics = admin.describe_topics([name])
            except Exception as exc:  # metadata not propagated yet
                last = exc
                time.sleep(0.1)
                continue
            last = topics
            info = next((t for t in topics if t.get("topic", t.get("name")) == name), None)
            if info is not None and not info.get("error_code"):
                parts = info.get("partitions") or []
                leaders = [p.get("leader_id", p.get("leader", -1)) for p in parts]
                if len(parts) == partitions and all(leader is not None and leader >= 0 for leader in leaders):
                    return
            time.sleep(0.1)
        raise HarnessError(f"topic {name!r} had no leader for every partition after {timeout_s}s: {last}")
    finally:
        admin.close()
