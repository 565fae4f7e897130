"""pytest fixtures for a real Apache Kafka broker (the ``throughline_kafka`` plugin).

Loaded by the ``pytest11`` entry point where the ``test`` extra is installed (``pytest_entry``), or named
by a suite (``pytest_plugins = ["throughline.testing.pytest_plugin"]``).

Session-wide, started lazily the first time a test asks for it, stopped at session end:

``kafka_broker``
    The :class:`~throughline.testing.kafka.KafkaHandle` (``.bootstrap_servers``, ``.provider``,
    ``.restart()`` where supported). Provisioned by :func:`~throughline.testing.kafka.provision_kafka`:
    ``THROUGHLINE_TEST_BOOTSTRAP_SERVERS``, else Docker, else a JVM broker from Maven Central jars.
``kafka_bootstrap``
    ``"host:port"`` of that broker.
``kafka_client_config``
    The ``KafkaClientConfig`` that reaches it: ``THROUGHLINE_KAFKA_CONFIG``'s file for an external
    (possibly secured) broker, PLAINTEXT for the brokers the harness starts. With a broker of its own
    the plugin removes ``THROUGHLINE_KAFKA_CONFIG`` from the session's environment, so that library
    calls and CLI subprocesses of the tests speak PLAINTEXT to it.
``kafka_cluster``
    A :class:`~throughline.testing.kafka.cluster.KafkaCluster`: three more JVM nodes (each a KRaft
    broker and controller) on loopback, for tests that kill leaders and controllers; started on first
    use, one for the session. A test that kills or stops nodes starts them again before it ends
    (``cluster.start()`` starts whatever is down and waits until it is healthy); the fixture checks
    that each test left it so.
``kafka_secured_broker``
    A :class:`~throughline.testing.kafka.secured.SecuredKafka`: one more JVM broker with SASL_SSL
    (PLAIN, SCRAM-SHA-256/512), mutual-TLS and wrong-host-name TLS listeners, certificates made for
    the session; started on first use only.
``schema_registry_url``
    The Confluent-compatible base URL of a real schema registry: ``THROUGHLINE_TEST_SCHEMA_REGISTRY``
    when set, else Apicurio Registry's server (:mod:`~throughline.testing.kafka.apicurio`, fetched
    from Maven Central once) on loopback, in memory, one for the session. Tests share it: give each
    test its own subjects (topic names from ``kafka_topic_name`` do).

Per test:

``kafka_topic_name`` / ``kafka_group_id``
    Unique names (nothing is created: tests create topics with the partitions they need).
``kafka_create_topic``
    ``kafka_create_topic(name, partitions=3, configs={...})`` on the session broker.
``kafka_admin``
    A ``KafkaAdminClient`` on the session broker, closed after the test.
``kafka_broker_factory``
    ``kafka_broker_factory()`` starts a *private* restartable broker (Docker or JVM, never the
    external one) for tests that stop, kill or restart it; all are closed after the test.

throughline itself in a container (:class:`~throughline.testing.containers.ThroughlineContainer`,
needs Docker and the project's image, ``THROUGHLINE_IMAGE`` or ``throughline:local``):

``throughline_container``
    One ``throughline serve`` for the session, on the session broker with a topic of its own
    (``.append(...)``, ``.read(project)``, ``.url``, ``.auth_token``). Tests share it: give each
    test its own project names (``throughline_project``).
``throughline_container_factory``
    ``throughline_container_factory(**options)`` starts one for this test alone; closed after it.
``throughline_project``
    A project name unique to this test.

When a test fails, the tail of the log of every broker it used (the session broker, its private
brokers) and of its serve containers is added to its report. Tests under a ``tests/integration/``
folder are marked ``integration``. Nothing is skipped.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from throughline.log import ENV_KAFKA_CONFIG, PLAINTEXT, KafkaClientConfig
from throughline.testing.kafka import (
    ENV_BOOTSTRAP,
    ENV_PROVIDER,
    DockerKafka,
    KafkaBroker,
    KafkaHandle,
    admin_client,
    create_topic,
    provision_kafka,
    provision_private_kafka,
)
from throughline.testing.kafka.apicurio import ENV_TEST_REGISTRY, ApicurioRegistry
from throughline.testing.kafka.cluster import KafkaCluster
from throughline.testing.kafka.secured import SecuredKafka

_INFO_KEY = pytest.StashKey[list[str]]()
# What a test used that has a log worth showing when it fails: (title, object with .diagnostics()).
_USED_KEY = pytest.StashKey[list[tuple[str, Any]]]()
_SESSION_BROKER_KEY = pytest.StashKey[KafkaHandle]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "integration: talks to a real Apache Kafka broker (started by the harness)")
    config.stash[_INFO_KEY] = []
    external = bool(os.environ.get(ENV_BOOTSTRAP, "").strip()) and os.environ.get(
        ENV_PROVIDER, "auto"
    ).strip().lower() in (
        "",
        "auto",
        "external",
    )
    if not external and os.environ.pop(ENV_KAFKA_CONFIG, ""):
        config.stash[_INFO_KEY].append(
            f"{ENV_KAFKA_CONFIG} was removed from the session's environment: the harness's own brokers speak PLAINTEXT"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.parts
        if any(a == "tests" and b == "integration" for a, b in zip(parts, parts[1:], strict=False)):
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    """A failed test's report carries the tail of the logs of the brokers and containers it used."""
    outcome: Any = yield
    report = outcome.get_result()
    if report.when not in ("setup", "call") or not report.failed:
        return
    stored: list[tuple[str, Any]] = item.stash.get(_USED_KEY, [])
    used = list(stored)
    fixtures = getattr(item, "fixturenames", ())
    session_broker = item.config.stash.get(_SESSION_BROKER_KEY, None)
    if session_broker is not None and {"kafka_broker", "kafka_bootstrap"} & set(fixtures):
        used.insert(0, (f"session broker: {session_broker.describe()}", session_broker))
    for title, owner in used:
        diagnostics = getattr(owner, "diagnostics", None)
        if diagnostics is None:
            continue
        try:
            text = diagnostics()
        except Exception as exc:  # a log that cannot be read must not hide the failure
            text = f"(could not read the log: {exc})"
        report.sections.append((f"throughline kafka: {title}", text))


def _used_by(request: pytest.FixtureRequest, title: str, owner: Any) -> None:
    node = request.node
    if _USED_KEY not in node.stash:
        node.stash[_USED_KEY] = []
    node.stash[_USED_KEY].append((title, owner))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    lines = config.stash.get(_INFO_KEY, [])
    if lines:
        terminalreporter.section("throughline kafka", sep="-")
        for line in lines:
            terminalreporter.write_line(line)


def _terminal_reporter(config: pytest.Config) -> Callable[[str], None]:
    """A reporter that writes straight to the terminal, even while output is captured."""
    tr = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")

    def report(message: str) -> None:
        line = f"[throughline.kafka] {message}"
        if tr is None:
            return
        if capman is not None:
            with capman.global_and_fixture_disabled():
                tr.ensure_newline()
                tr.write_line(line)
        else:
            tr.ensure_newline()
            tr.write_line(line)

    return report


def _sanitize(name: str, limit: int = 80) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._")
    return (cleaned[:limit].rstrip("-._") or "test").lower()


def _announce(request: pytest.FixtureRequest, line: str) -> None:
    """Say ``line`` now and again in the session's summary."""
    _terminal_reporter(request.config)(line)
    request.config.stash[_INFO_KEY].append(line)


@pytest.fixture(scope="session")
def kafka_broker(request: pytest.FixtureRequest) -> Iterator[KafkaHandle]:
    """The session's Kafka broker, provisioned on first use and closed at session end."""
    report = _terminal_reporter(request.config)
    started = time.monotonic()
    handle = provision_kafka(report=report)
    elapsed = time.monotonic() - started
    _announce(
        request,
        f"provider={handle.provider} bootstrap={handle.bootstrap_servers} ready in {elapsed:.1f}s: {handle.describe()}",
    )
    request.config.stash[_SESSION_BROKER_KEY] = handle
    try:
        yield handle
    finally:
        del request.config.stash[_SESSION_BROKER_KEY]
        handle.close()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: KafkaHandle) -> str:
    """``"host:port"`` of the session's Kafka broker."""
    return kafka_broker.bootstrap_servers


@pytest.fixture(scope="session")
def kafka_client_config(kafka_broker: KafkaHandle) -> KafkaClientConfig:
    """How to reach the session's broker (an external one's ``THROUGHLINE_KAFKA_CONFIG``, else PLAINTEXT)."""
    config = getattr(kafka_broker, "kafka_config", PLAINTEXT)
    assert isinstance(config, KafkaClientConfig)
    return config


@pytest.fixture(scope="session")
def kafka_secured_broker(request: pytest.FixtureRequest) -> Iterator[SecuredKafka]:
    """A JVM broker with secured listeners (SASL_SSL, mutual TLS, a wrong-host-name certificate)."""
    with contextlib.closing(SecuredKafka(report=_terminal_reporter(request.config)).start()) as broker:
        _announce(request, f"{broker.describe()} ready in {broker.startup_s:.1f}s")
        yield broker


@pytest.fixture(scope="session")
def schema_registry_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The session's schema registry: ``THROUGHLINE_TEST_SCHEMA_REGISTRY``, else Apicurio Registry on loopback."""
    external = os.environ.get(ENV_TEST_REGISTRY, "").strip()
    if external:
        _announce(request, f"schema registry: {external} (from ${ENV_TEST_REGISTRY})")
        yield external.rstrip("/")
        return
    with contextlib.closing(ApicurioRegistry(report=_terminal_reporter(request.config)).start()) as server:
        _announce(request, f"schema registry: {server.describe()} ready in {server.last_startup_s or 0:.1f}s")
        yield server.url


@pytest.fixture(scope="session")
def _kafka_cluster_session(request: pytest.FixtureRequest) -> Iterator[KafkaCluster]:
    with contextlib.closing(KafkaCluster(report=_terminal_reporter(request.config)).start()) as cluster:
        _announce(request, f"{cluster.describe()} ready in {cluster.last_startup_s or 0:.1f}s")
        yield cluster


@pytest.fixture
def kafka_cluster(request: pytest.FixtureRequest, _kafka_cluster_session: KafkaCluster) -> Iterator[KafkaCluster]:
    """The session's three-node KRaft cluster, healthy at the start of the test; a test that leaves a
    node down fails (after its nodes are started again, so that the next test has three)."""
    cluster = _kafka_cluster_session
    cluster.start()  # a test before this one that failed half-way may have left a node down
    _used_by(request, f"cluster {cluster.describe()}", cluster)
    yield cluster
    down = [i for i in cluster.node_ids if i not in cluster.running()]
    cluster.start()
    assert not down, f"the test left cluster nodes {down} down (started again for the next test)"


@pytest.fixture
def kafka_topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique to this test (not created)."""
    return f"t-{_sanitize(request.node.name)}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def kafka_group_id(request: pytest.FixtureRequest) -> str:
    """A consumer group id unique to this test."""
    return f"g-{_sanitize(request.node.name)}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def kafka_admin(kafka_bootstrap: str, kafka_client_config: KafkaClientConfig) -> Iterator[Any]:
    """A ``kafka.admin.KafkaAdminClient`` on the session broker, closed after the test."""
    admin = admin_client(kafka_bootstrap, 30.0, kafka_client_config)
    try:
        yield admin
    finally:
        admin.close()


@pytest.fixture
def kafka_create_topic(kafka_bootstrap: str, kafka_client_config: KafkaClientConfig) -> Callable[..., str]:
    """``kafka_create_topic(name, partitions=1, configs=None)`` creates a topic and returns its name."""

    def _create(name: str, partitions: int = 1, configs: Mapping[str, str] | None = None) -> str:
        create_topic(kafka_bootstrap, name, partitions=partitions, configs=configs, kafka_config=kafka_client_config)
        return name

    return _create


@pytest.fixture
def kafka_broker_factory(request: pytest.FixtureRequest) -> Iterator[Callable[[], KafkaBroker | DockerKafka]]:
    """Start private, restartable brokers for destructive tests; each is closed after the test."""
    report = _terminal_reporter(request.config)
    started: list[KafkaBroker | DockerKafka] = []

    def _start() -> KafkaBroker | DockerKafka:
        handle = provision_private_kafka(report=report)
        started.append(handle)
        line = f"private broker for {request.node.name}: provider={handle.provider} {handle.describe()}"
        report(line)
        _used_by(request, f"private broker {handle.describe()}", handle)
        return handle

    try:
        yield _start
    finally:
        for handle in reversed(started):
            handle.close()


@pytest.fixture
def throughline_project(request: pytest.FixtureRequest) -> str:
    """A project name unique to this test."""
    return f"project-{_sanitize(request.node.name, 40)}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def throughline_container(request: pytest.FixtureRequest, kafka_broker: KafkaHandle) -> Iterator[Any]:
    """``throughline serve`` in a container for the session, on the session broker (its own topic)."""
    from throughline.testing.containers import ThroughlineContainer

    report = _terminal_reporter(request.config)
    container = ThroughlineContainer(kafka_broker, report=report).start()
    _announce(request, f"throughline container: {container.describe()}")
    try:
        yield container
    finally:
        container.close()


@pytest.fixture
def throughline_container_factory(
    request: pytest.FixtureRequest, kafka_broker: KafkaHandle
) -> Iterator[Callable[..., Any]]:
    """``throughline_container_factory(**options)``: a serve container for this test alone, closed after it."""
    from throughline.testing.containers import ThroughlineContainer

    report = _terminal_reporter(request.config)
    started: list[Any] = []

    def _start(**options: Any) -> Any:
        container = ThroughlineContainer(options.pop("kafka", kafka_broker), report=report, **options)
        started.append(container)
        _used_by(request, f"serve container {container.describe()}", container)
        return container.start()

    try:
        yield _start
    finally:
        for container in reversed(started):
            container.close()
