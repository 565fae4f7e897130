"""A real Apache Kafka broker for tests, benchmarks and local development.

Three ways to get one, tried in this order by :func:`provision_kafka`:

1. **external** -- ``THROUGHLINE_TEST_BOOTSTRAP_SERVERS`` is set: use that broker, start nothing.
2. **docker** -- a Docker engine answers a ping: run ``apache/kafka:4.1.0`` (single KRaft node)
   with testcontainers.
3. **jvm** -- otherwise: fetch Apache Kafka 4.1.0 jars from Maven Central once (with ``mvn``) into
   a cache folder, and run ``kafka.Kafka`` as a combined broker+controller on loopback ports.

``THROUGHLINE_KAFKA_PROVIDER=external|docker|jvm`` forces one of them (``auto`` is the default).

Every broker this module starts listens on 127.0.0.1 only, and every wait is bounded in time.

Command line (also wrapped by ``scripts/kafka-local``)::

    python -m throughline.testing.kafka start  [--state-dir DIR]   # detached broker, prints `export ...`
    python -m throughline.testing.kafka status [--state-dir DIR]
    python -m throughline.testing.kafka stop   [--state-dir DIR] [--keep-data]
    python -m throughline.testing.kafka fetch                      # only fetch the jars

Environment variables:

``THROUGHLINE_TEST_BOOTSTRAP_SERVERS``
    Use this broker instead of starting one.
``THROUGHLINE_KAFKA_PROVIDER``
    ``auto`` (default), ``external``, ``docker`` or ``jvm``.
``THROUGHLINE_KAFKA_CACHE``
    Where the Maven-fetched jars live (default ``~/.cache/throughline/kafka-4.1.0``).
``THROUGHLINE_KAFKA_STATE``
    State folder of the CLI's detached broker (default ``./.cache/kafka-local``).
``THROUGHLINE_KAFKA_KEEP_WORKDIR``
    ``1`` keeps a JVM broker's work dir (data, ``logs/broker.log``) after it stops.
``THROUGHLINE_KAFKA_LOG_LEVEL``
    log4j2 level for the JVM broker's ``logs/broker.log`` (default ``WARN``).
``THROUGHLINE_KAFKA_STARTUP_TIMEOUT``
    Seconds to wait for a broker to answer (default 90).
``THROUGHLINE_HARNESS_TAG``
    Added to the broker's java command line as ``-Dthroughline.harness.tag=...`` so that a CI
    script can find, and stop, exactly the brokers it started.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import ctypes
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "DEFAULT_STARTUP_TIMEOUT_S",
    "DOCKER_IMAGE",
    "ENV_BOOTSTRAP",
    "ENV_CACHE",
    "ENV_PROVIDER",
    "ENV_STATE",
    "KAFKA_VERSION",
    "BrokerSettings",
    "BrokerStartError",
    "BrokerState",
    "DockerKafka",
    "DockerUnavailableError",
    "ExternalKafka",
    "admin_client",
    "HarnessError",
    "JavaNotFoundError",
    "KafkaBroker",
    "KafkaDistribution",
    "KafkaHandle",
    "MavenFetchError",
    "create_topic",
    "docker_available",
    "fetch_kafka_jars",
    "free_port",
    "kafka_cache_dir",
    "main",
    "provision_kafka",
    "provision_private_kafka",
    "running_broker",
    "start_broker",
    "wait_for_kafka",
]

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

DEFAULT_STARTUP_TIMEOUT_S = 90.0
DEFAULT_STOP_TIMEOUT_S = 15.0
MAVEN_TIMEOUT_S = 900.0
FORMAT_TIMEOUT_S = 120.0
FETCH_LOCK_TIMEOUT_S = MAVEN_TIMEOUT_S + 60.0

_PACKAGE = "throughline.testing"
_POM_RESOURCE = "pom.xml"
_LOG4J_RESOURCE = "log4j2.xml"
_SERVER_TEMPLATE_RESOURCE = "kafka-server-template.properties"
_MARKER_NAME = ".complete.json"
_STATE_FILE = "broker.json"
_BROKER_META = "broker-meta.json"

Reporter = Callable[[str], None]

_log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class HarnessError(RuntimeError):
    """Root of every error raised by the Kafka test harness."""


class MavenFetchError(HarnessError):
    """Fetching the Kafka jars from Maven Central failed (or ``mvn`` is missing)."""


class JavaNotFoundError(HarnessError):
    """No ``java`` executable (Java 17+) was found."""


class BrokerStartError(HarnessError):
    """A broker did not become ready: it exited, timed out, or could not be configured."""


class DockerUnavailableError(HarnessError):
    """The docker provider was forced, but no Docker engine answered."""


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------


def _stderr_reporter(message: str) -> None:
    print(f"[throughline.kafka] {message}", file=sys.stderr, flush=True)


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise HarnessError(f"{name}={raw!r} is not a number of seconds") from exc


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def startup_timeout_s() -> float:
    """Seconds to wait for a broker to answer (``THROUGHLINE_KAFKA_STARTUP_TIMEOUT``, default 90)."""
    return _env_float(ENV_STARTUP_TIMEOUT, DEFAULT_STARTUP_TIMEOUT_S)


def _read_resource(name: str) -> str:
    return resources.files(_PACKAGE).joinpath(name).read_text(encoding="utf-8")


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port that is free on ``host`` right now (the OS picks it)."""
    return _free_ports(1, host)[0]


def _free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _tcp_open(host: str, port: int, timeout_s: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=max(0.05, timeout_s)):
            return True
    except OSError:
        return False


def _split_bootstrap(bootstrap_servers: str) -> tuple[str, int]:
    first = bootstrap_servers.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    if not host or not port.isdigit():
        raise HarnessError(f"bootstrap servers {bootstrap_servers!r} are not host:port")
    return host.strip("[]"), int(port)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    text = data[-64 * 1024 :].decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def _random_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, base64url without padding (like ``random-uuid``)."""
    for _ in range(100):
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        # Kafka's own generator avoids ids starting with '-' (they read as command-line flags).
        if not cid.startswith("-"):
            return cid
    raise HarnessError("could not generate a cluster id")  # pragma: no cover


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); treat it as dead.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _pid_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", errors="replace") for part in raw.split(b"\0") if part]


def _pdeathsig_preexec() -> Callable[[], None] | None:
    """On Linux, make the child get SIGTERM if the thread that started it dies.

    That covers a test runner that is SIGKILLed (a CI timeout): its broker goes with it. It is
    only used from the main thread, because the kernel ties the signal to the *thread*.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1
    sigterm = int(signal.SIGTERM)

    def _preexec() -> None:
        prctl(pr_set_pdeathsig, sigterm, 0, 0, 0)

    return _preexec


def find_java() -> str:
    """Locate ``java``: ``$JAVA_HOME/bin/java`` first, then ``PATH``."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("java")
    if not found:
        raise JavaNotFoundError(
            "no `java` found (JAVA_HOME or PATH); Kafka 4.x needs Java 17+. "
            f"Install one, or point {ENV_BOOTSTRAP} at a running broker."
        )
    return found


# --------------------------------------------------------------------------------------------
# Fetching Kafka from Maven Central
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KafkaDistribution:
    """A complete set of Kafka broker jars in a cache folder, as fetched by :func:`fetch_kafka_jars`."""

    root: Path
    """The cache folder (``$THROUGHLINE_KAFKA_CACHE`` or ``~/.cache/throughline/kafka-4.1.0``)."""
    libs_dir: Path
    """The folder holding every jar; the classpath is ``libs_dir/*``."""
    kafka_version: str
    jars: tuple[str, ...]
    """File names of the jars, sorted."""

    @property
    def classpath(self) -> str:
        """The java ``-cp`` argument (a wildcard over :attr:`libs_dir`)."""
        return str(self.libs_dir / "*")

    def jar_version(self, artifact: str) -> str | None:
        """Version of ``artifact`` (e.g. ``"slf4j-api"``) among the jars, or None if it is absent."""
        prefix = artifact + "-"
        for jar in self.jars:
            rest = jar[len(prefix) : -len(".jar")] if jar.startswith(prefix) and jar.endswith(".jar") else ""
            if rest and rest[0].isdigit():
                return rest
        return None


def kafka_cache_dir() -> Path:
    """Where the Kafka jars are cached: ``$THROUGHLINE_KAFKA_CACHE`` or ``~/.cache/throughline/kafka-4.1.0``."""
    configured = os.environ.get(ENV_CACHE, "").strip()
    if configured:
        return Path(configured).expanduser().resolve()
    return Path.home() / ".cache" / "throughline" / f"kafka-{KAFKA_VERSION}"


def _pom_fingerprint(pom_text: str) -> str:
    return hashlib.sha256(pom_text.encode("utf-8")).hexdigest()


def _load_distribution(root: Path, fingerprint: str) -> KafkaDistribution | None:
    marker = root / _MARKER_NAME
    libs = root / "libs"
    try:
        meta = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if meta.get("pom_sha256") != fingerprint or not libs.is_dir():
        return None
    jars = tuple(sorted(p.name for p in libs.glob("*.jar")))
    if tuple(meta.get("jars", ())) != jars:
        return None
    return KafkaDistribution(root=root, libs_dir=libs, kafka_version=KAFKA_VERSION, jars=jars)


@contextlib.contextmanager
def _file_lock(path: Path, timeout_s: float, report: Reporter) -> Iterator[None]:
    """An exclusive ``flock`` on ``path``, waited for at most ``timeout_s``."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        deadline = time.monotonic() + timeout_s
        announced = False
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise MavenFetchError(
                        f"timed out after {timeout_s:.0f}s waiting for another fetch to finish ({path})"
                    ) from None
                if not announced:
                    report(f"waiting for another process fetching Kafka jars (lock {path})")
                    announced = True
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _check_jars(libs: Path) -> tuple[str, ...]:
    jars = tuple(sorted(p.name for p in libs.glob("*.jar")))
    required = [
        f"kafka_{SCALA_VERSION}-{KAFKA_VERSION}.jar",
        f"kafka-clients-{KAFKA_VERSION}.jar",
        f"kafka-server-{KAFKA_VERSION}.jar",
    ]
    missing = [name for name in required if name not in jars]
    for prefix in ("slf4j-api-", "log4j-core-"):
        if not any(j.startswith(prefix) for j in jars):
            missing.append(prefix + "*.jar")
    slf4j = next((j for j in jars if j.startswith("slf4j-api-")), "")
    binding = "log4j-slf4j2-impl-" if slf4j.startswith("slf4j-api-2.") else "log4j-slf4j-impl-"
    if not any(j.startswith(binding) for j in jars):
        missing.append(f"{binding}*.jar (the SLF4J binding matching {slf4j or 'slf4j-api'})")
    if missing:
        raise MavenFetchError(f"Maven resolved an incomplete Kafka classpath in {libs}; missing: {missing}")
    return jars


def fetch_kafka_jars(
    cache_dir: Path | str | None = None,
    *,
    report: Reporter | None = None,
    timeout_s: float = MAVEN_TIMEOUT_S,
) -> KafkaDistribution:
    """Fetch Apache Kafka 4.1.0 (and a log4j2 SLF4J binding) from Maven Central, once.

    Runs ``mvn -q -B dependency:copy-dependencies`` on the ``pom.xml`` shipped in this package.
    A marker file makes it idempotent, and a lock file makes concurrent callers (pytest-xdist
    workers, two terminals) wait for one fetch instead of racing.
    """
    report = report or _stderr_reporter
    root = Path(cache_dir).expanduser().resolve() if cache_dir is not None else kafka_cache_dir()
    pom_text = _read_resource(_POM_RESOURCE)
    fingerprint = _pom_fingerprint(pom_text)
    found = _load_distribution(root, fingerprint)
    if found is not None:
        return found

    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / ".fetch.lock", FETCH_LOCK_TIMEOUT_S, report):
        found = _load_distribution(root, fingerprint)
        if found is not None:
            return found
        mvn = os.environ.get("THROUGHLINE_MVN") or shutil.which("mvn")
        if not mvn:
            raise MavenFetchError(
                "Maven (`mvn`) is not on PATH, so Kafka's jars cannot be fetched; install Maven 3.8+, "
                f"start Docker, or point {ENV_BOOTSTRAP} at a running broker."
            )
        report(f"fetching Apache Kafka {KAFKA_VERSION} jars from Maven Central into {root} (one-time) ...")
        started = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=".fetch-", dir=root))
        try:
            pom = work / "pom.xml"
            pom.write_text(pom_text, encoding="utf-8")
            out_dir = work / "libs"
            cmd = [
                mvn,
                "-q",
                "-B",
                "-Dstyle.color=never",
                "-f",
                str(pom),
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={out_dir}",
            ]
            try:
                proc = subprocess.run(
                    cmd,
                    cwd=work,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    text=True,
                    timeout=timeout_s,
                    check=False,
                )
            except subprocess.TimeoutExpired as exc:
                raise MavenFetchError(f"`mvn` did not finish within {timeout_s:.0f}s") from exc
            except OSError as exc:
                raise MavenFetchError(f"could not run {mvn}: {exc}") from exc
            if proc.returncode != 0:
                output = (proc.stdout + proc.stderr).strip().splitlines()[-40:]
                raise MavenFetchError(
                    f"`{' '.join(cmd)}` failed with exit code {proc.returncode}:\n" + "\n".join(output)
                )
            jars = _check_jars(out_dir)
            libs = root / "libs"
            if libs.exists():
                shutil.rmtree(libs)
            out_dir.rename(libs)
            marker = {
                "kafka_version": KAFKA_VERSION,
                "pom_sha256": fingerprint,
                "jars": list(jars),
                "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            tmp_marker = root / (_MARKER_NAME + ".tmp")
            tmp_marker.write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
            tmp_marker.replace(root / _MARKER_NAME)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        dist = KafkaDistribution(root=root, libs_dir=root / "libs", kafka_version=KAFKA_VERSION, jars=jars)
        report(
            f"fetched {len(jars)} jars in {time.monotonic() - started:.1f}s "
            f"(kafka {KAFKA_VERSION}, slf4j-api {dist.jar_version('slf4j-api')}, "
            f"log4j-core {dist.jar_version('log4j-core')})"
        )
        return dist


# --------------------------------------------------------------------------------------------
# Readiness and topics
# --------------------------------------------------------------------------------------------


def admin_client(bootstrap_servers: str, timeout_s: float) -> Any:
    """A ``KafkaAdminClient`` with short timeouts (works with kafka-python 2.x and 3.x)."""
    from kafka.admin import KafkaAdminClient

    timeout_ms = max(1000, int(timeout_s * 1000))
    configs: dict[str, Any] = {
        "bootstrap_servers": bootstrap_servers,
        "client_id": "throughline-harness",
        "request_timeout_ms": timeout_ms,
    }
    defaults = getattr(KafkaAdminClient, "DEFAULT_CONFIG", {})
    if "bootstrap_timeout_ms" in defaults:
        configs["bootstrap_timeout_ms"] = timeout_ms
    if "api_version_auto_timeout_ms" in defaults:
        configs["api_version_auto_timeout_ms"] = timeout_ms
    return KafkaAdminClient(**configs)


def _probe(bootstrap_servers: str, timeout_s: float) -> int:
    """One readiness probe: describe the cluster and list topics. Returns the broker count."""
    admin = admin_client(bootstrap_servers, timeout_s)
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
) -> float:
    """Block until the broker at ``bootstrap_servers`` answers admin requests.

    Fails early (with ``diagnostics()``) if ``is_alive()`` turns false, and raises
    :class:`BrokerStartError` after ``timeout_s`` seconds or ``max_attempts`` probes.
    Returns the seconds waited.
    """
    timeout_s = startup_timeout_s() if timeout_s is None else timeout_s
    host, port = _split_bootstrap(bootstrap_servers)
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
        if _tcp_open(host, port, min(1.0, remaining)):
            try:
                _probe(bootstrap_servers, min(5.0, max(1.0, remaining)))
                return time.monotonic() - started
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
) -> None:
    """Create topic ``name`` and wait (bounded) until every partition has a leader."""
    from kafka.admin import NewTopic

    admin = admin_client(bootstrap_servers, timeout_s)
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


# --------------------------------------------------------------------------------------------
# The handle every provider returns
# --------------------------------------------------------------------------------------------


@runtime_checkable
class KafkaHandle(Protocol):
    """What :func:`provision_kafka` returns, whichever way the broker was provisioned."""

    @property
    def provider(self) -> str:
        """``"external"``, ``"docker"`` or ``"jvm"``."""
        ...

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` for Kafka clients."""
        ...

    @property
    def supports_restart(self) -> bool:
        """Whether :meth:`restart` can stop and start the broker on the same data."""
        ...

    def describe(self) -> str:
        """One human-readable line: provider, address, where its data/logs are."""
        ...

    def restart(self, *, graceful: bool = True) -> None:
        """Stop the broker and start it again on the same data directory and ports."""
        ...

    def close(self) -> None:
        """Stop the broker (if this harness started it) and release its resources."""
        ...


@dataclass(frozen=True)
class ExternalKafka:
    """A broker somebody else runs (``THROUGHLINE_TEST_BOOTSTRAP_SERVERS``); nothing to start or stop."""

    bootstrap_servers: str
    provider: str = "external"

    @property
    def supports_restart(self) -> bool:
        return False

    def describe(self) -> str:
        return f"external broker at {self.bootstrap_servers} (from ${ENV_BOOTSTRAP})"

    def restart(self, *, graceful: bool = True) -> None:
        raise HarnessError(f"cannot restart an external broker ({self.bootstrap_servers})")

    def close(self) -> None:
        return None


# --------------------------------------------------------------------------------------------
# The JVM broker
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BrokerSettings:
    """How a JVM :class:`KafkaBroker` is configured. Ports of 0 are picked free on first start."""

    host: str = LOOPBACK
    port: int = 0
    controller_port: int = 0
    heap_min: str = "256m"
    heap_max: str = "512m"
    startup_timeout_s: float | None = None
    """None: ``THROUGHLINE_KAFKA_STARTUP_TIMEOUT`` or 90 s."""
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S
    auto_create_topics: bool = False
    keep_work_dir: bool | None = None
    """Keep the work dir on :meth:`KafkaBroker.close`; None: ``THROUGHLINE_KAFKA_KEEP_WORKDIR``."""
    log_level: str | None = None
    """log4j2 level of ``logs/broker.log``; None: ``THROUGHLINE_KAFKA_LOG_LEVEL`` or WARN."""
    extra_properties: tuple[tuple[str, str], ...] = ()
    """Appended to server.properties (later keys win), e.g. ``(("log.segment.bytes", "1048576"),)``."""
    extra_jvm_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class BrokerState:
    """What the CLI records about its detached broker (``<state-dir>/broker.json``)."""

    pid: int
    bootstrap_servers: str
    work_dir: str
    port: int
    controller_port: int
    started_at: str
    kafka_version: str = KAFKA_VERSION

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> BrokerState:
        data = json.loads(text)
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


_LIVE: set[KafkaBroker | DockerKafka] = set()
_LIVE_LOCK = threading.Lock()


def _cleanup_at_exit() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for handle in live:
        with contextlib.suppress(Exception):
            handle.close()


atexit.register(_cleanup_at_exit)


class KafkaBroker:
    """A real Apache Kafka 4.x broker (combined KRaft broker+controller) in a child JVM.

    Each broker has its own work dir holding ``server.properties``, ``data/`` (``log.dirs`` and
    KRaft metadata) and ``logs/`` (``broker.log`` at WARN+, ``stdout.log``, ``stderr.log``).
    The JVM runs in its own process group, bound to 127.0.0.1 only.

    ``stop(keep_data=True)`` followed by ``start()`` (or simply ``restart()``) brings the same
    broker back on the same data directory, ports and cluster id. ``kill()`` is a crash (SIGKILL).

    Usage::

        with KafkaBroker() as broker:
            producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    """

    provider = "jvm"

    def __init__(
        self,
        *,
        settings: BrokerSettings | None = None,
        work_dir: Path | str | None = None,
        distribution: KafkaDistribution | None = None,
        detached: bool = False,
        report: Reporter | None = None,
    ) -> None:
        """Configure a broker; nothing starts until :meth:`start`.

        ``work_dir`` defaults to a fresh temporary folder. If it holds the metadata of an earlier
        broker (``broker-meta.json``), that broker's ports and cluster id are reused.
        ``detached`` brokers outlive this Python process (no atexit stop, no parent-death signal).
        """
        self.settings = settings or BrokerSettings()
        self._distribution = distribution
        self._detached = detached
        self._report = report or _stderr_reporter
        self._work_dir: Path | None = Path(work_dir).resolve() if work_dir is not None else None
        self._port = self.settings.port
        self._controller_port = self.settings.controller_port
        self._cluster_id: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid: int | None = None
        self.last_startup_s: float | None = None
        """Seconds the most recent :meth:`start` took (JVM launch until the broker answered)."""
        self._load_meta()

    # -- properties ---------------------------------------------------------------------------

    @property
    def supports_restart(self) -> bool:
        return True

    @property
    def host(self) -> str:
        return self.settings.host

    @property
    def port(self) -> int:
        if not self._port:
            raise HarnessError("broker has no port yet: call start() first")
        return self._port

    @property
    def controller_port(self) -> int:
        if not self._controller_port:
            raise HarnessError("broker has no controller port yet: call start() first")
        return self._controller_port

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def work_dir(self) -> Path:
        if self._work_dir is None:
            raise HarnessError("broker has no work dir yet: call start() first")
        return self._work_dir

    @property
    def data_dir(self) -> Path:
        return self.work_dir / "data"

    @property
    def log_dir(self) -> Path:
        return self.work_dir / "logs"

    @property
    def cluster_id(self) -> str | None:
        return self._cluster_id

    @property
    def pid(self) -> int | None:
        if self._proc is not None:
            return self._proc.pid
        return self._pid

    def is_running(self) -> bool:
        """Whether the broker's JVM is alive (it may not be ready yet)."""
        if self._proc is not None:
            return self._proc.poll() is None
        return self._pid is not None and _pid_alive(self._pid)

    def describe(self) -> str:
        where = f", work dir {self._work_dir}" if self._work_dir else ""
        return f"JVM Kafka {KAFKA_VERSION} broker at {self.bootstrap_servers} (pid {self.pid}{where})"

    def diagnostics(self, lines: int = 40) -> str:
        """The tail of the broker's logs, for error messages."""
        if self._work_dir is None:
            return ""
        parts = []
        try:
            errors = [
                line
                for line in (self.log_dir / "broker.log").read_text(errors="replace").splitlines()
                if " ERROR " in line or " FATAL " in line
            ]
        except OSError:
            errors = []
        if errors:
            parts.append(
                f"--- first ERROR lines of {self.log_dir / 'broker.log'} ---\n" + "\n".join(errors[:5])
            )
        for name in ("broker.log", "stderr.log", "stdout.log", "format.log"):
            text = _tail(self.log_dir / name, lines)
            if text.strip():
                parts.append(f"--- {self.log_dir / name} (tail) ---\n{text}")
        if not self._keep_work_dir():
            parts.append(f"(the work dir is removed on close; {ENV_KEEP_WORKDIR}=1 keeps it)")
        return "\n".join(parts) or f"(no broker output in {self.log_dir})"

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, *, timeout_s: float | None = None) -> KafkaBroker:
        """Start the JVM (formatting storage on first start) and wait until it answers."""
        if self.is_running():
            return self
        timeout_s = timeout_s if timeout_s is not None else self.settings.startup_timeout_s
        timeout_s = startup_timeout_s() if timeout_s is None else timeout_s
        dist = self._distribution or fetch_kafka_jars(report=self._report)
        self._distribution = dist
        java = find_java()
        self._prepare_work_dir()
        if not (self.data_dir / "meta.properties").exists():
            self._format_storage(java, dist)

        self.log_dir.mkdir(parents=True, exist_ok=True)
        cmd = [java, *self._jvm_args(), "-cp", dist.classpath, "kafka.Kafka", str(self._properties_path)]
        started = time.monotonic()
        with open(self.log_dir / "stdout.log", "ab") as out, open(self.log_dir / "stderr.log", "ab") as err:
            self._proc = subprocess.Popen(
                cmd,
                cwd=self.work_dir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
                close_fds=True,
                preexec_fn=None if self._detached else _pdeathsig_preexec(),
            )
        self._pid = self._proc.pid
        (self.work_dir / "broker.pid").write_text(f"{self._pid}\n")
        if not self._detached:
            with _LIVE_LOCK:
                _LIVE.add(self)
        try:
            wait_for_kafka(
                self.bootstrap_servers,
                timeout_s=timeout_s,
                is_alive=self.is_running,
                diagnostics=self.diagnostics,
            )
        except BaseException:
            self._terminate(graceful=False, timeout_s=self.settings.stop_timeout_s)
            raise
        self.last_startup_s = time.monotonic() - started
        return self

    def stop(self, *, keep_data: bool = False, graceful: bool = True, timeout_s: float | None = None) -> None:
        """Stop the JVM: SIGTERM, wait (15 s), then SIGKILL. ``graceful=False`` sends SIGKILL at once.

        With ``keep_data=True`` the work dir stays so that :meth:`start` brings the same broker
        back; otherwise it is removed (unless ``keep_work_dir``/``THROUGHLINE_KAFKA_KEEP_WORKDIR``).
        """
        self._terminate(graceful=graceful, timeout_s=timeout_s or self.settings.stop_timeout_s)
        if keep_data:
            return
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if self._work_dir is not None and not self._keep_work_dir():
            shutil.rmtree(self._work_dir, ignore_errors=True)

    def kill(self) -> None:
        """Crash the broker (SIGKILL to its process group), keeping its data for :meth:`start`."""
        self.stop(keep_data=True, graceful=False)

    def restart(self, *, graceful: bool = True) -> None:
        """Stop (keeping data) and start again on the same data directory, ports and cluster id."""
        self.stop(keep_data=True, graceful=graceful)
        self.start()

    def close(self) -> None:
        """Stop the broker and remove its work dir (kept if configured to)."""
        self.stop(keep_data=False)

    # -- internals ----------------------------------------------------------------------------

    def _keep_work_dir(self) -> bool:
        if self.settings.keep_work_dir is not None:
            return self.settings.keep_work_dir
        return _env_flag(ENV_KEEP_WORKDIR)

    @property
    def _properties_path(self) -> Path:
        return self.work_dir / "server.properties"

    def _load_meta(self) -> None:
        if self._work_dir is None:
            return
        try:
            meta = json.loads((self._work_dir / _BROKER_META).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if meta.get("host") == self.settings.host:
            self._port = self._port or int(meta.get("port", 0))
            self._controller_port = self._controller_port or int(meta.get("controller_port", 0))
            self._cluster_id = meta.get("cluster_id")

    def _prepare_work_dir(self) -> None:
        if self._work_dir is None:
            _sweep_stale_work_dirs()
            self._work_dir = Path(tempfile.mkdtemp(prefix=_TEMP_PREFIX))
        self._work_dir.mkdir(parents=True, exist_ok=True)
        (self._work_dir / "logs").mkdir(exist_ok=True)
        if not self._port or not self._controller_port:
            picked = _free_ports(2, self.settings.host)
            self._port = self._port or picked[0]
            self._controller_port = self._controller_port or picked[1]
        if self._cluster_id is None:
            self._cluster_id = _random_cluster_id()
        template = Template(_read_resource(_SERVER_TEMPLATE_RESOURCE))
        text = template.substitute(
            host=self.settings.host,
            port=self._port,
            controller_port=self._controller_port,
            data_dir=str(self.data_dir),
            auto_create_topics="true" if self.settings.auto_create_topics else "false",
        )
        if self.settings.extra_properties:
            text += "\n# extra properties\n" + "".join(
                f"{k}={v}\n" for k, v in self.settings.extra_properties
            )
        self._properties_path.write_text(text, encoding="utf-8")
        (self._work_dir / "log4j2.xml").write_text(_read_resource(_LOG4J_RESOURCE), encoding="utf-8")
        meta = {
            "host": self.settings.host,
            "port": self._port,
            "controller_port": self._controller_port,
            "cluster_id": self._cluster_id,
            "kafka_version": KAFKA_VERSION,
        }
        (self._work_dir / _BROKER_META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")

    def _log_props(self) -> list[str]:
        level = self.settings.log_level or os.environ.get(ENV_LOG_LEVEL, "").strip() or "WARN"
        return [
            f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.xml'}",
            f"-Dkafka.logs.dir={self.log_dir}",
            f"-Dthroughline.kafka.log.level={level}",
        ]

    def _jvm_args(self) -> list[str]:
        args = [
            f"-Xms{self.settings.heap_min}",
            f"-Xmx{self.settings.heap_max}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            "-Djava.net.preferIPv4Stack=true",
            *self._log_props(),
            f"-Dthroughline.harness.workdir={self.work_dir}",
        ]
        tag = os.environ.get(ENV_HARNESS_TAG, "").strip()
        if tag:
            args.append(f"-Dthroughline.harness.tag={tag}")
        return [*args, *self.settings.extra_jvm_args]

    def _format_storage(self, java: str, dist: KafkaDistribution) -> None:
        assert self._cluster_id is not None
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # Static quorum (controller.quorum.voters), so no --standalone / --initial-controllers.
        cmd = [
            java,
            "-Xmx256m",
            *self._log_props(),
            "-cp",
            dist.classpath,
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            self._cluster_id,
            "--config",
            str(self._properties_path),
        ]
        try:
            proc = subprocess.run(
                cmd,
                cwd=self.work_dir,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=FORMAT_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise BrokerStartError(f"formatting KRaft storage took over {FORMAT_TIMEOUT_S:.0f}s") from exc
        (self.log_dir / "format.log").write_bytes(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise BrokerStartError(
                f"`kafka.tools.StorageTool format` failed (exit {proc.returncode}):\n{self.diagnostics()}"
            )

    def _terminate(self, *, graceful: bool, timeout_s: float) -> None:
        pid = self.pid
        if pid is None or not self.is_running():
            self._reap()
            return
        sig = signal.SIGTERM if graceful else signal.SIGKILL
        _signal_group(pid, sig)
        if not self._wait_exit(timeout_s if graceful else 5.0) and graceful:
            self._report(f"broker pid {pid} ignored SIGTERM for {timeout_s:.0f}s; killing it")
            _signal_group(pid, signal.SIGKILL)
            self._wait_exit(5.0)
        self._reap()

    def _wait_exit(self, timeout_s: float) -> bool:
        if self._proc is not None:
            try:
                self._proc.wait(timeout=timeout_s)
                return True
            except subprocess.TimeoutExpired:
                return False
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.is_running():
                return True
            time.sleep(0.1)
        return not self.is_running()

    def _reap(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=1)
        self._proc = None
        self._pid = None


_TEMP_PREFIX = "throughline-kafka-"
_STALE_AFTER_S = 3600.0


def _sweep_stale_work_dirs(max_dirs: int = 200) -> None:
    """Remove temp work dirs of brokers whose owner was killed before it could clean up.

    Only dirs with a ``broker.pid`` older than an hour, whose process is gone (or is no longer
    a broker of that dir), are removed.
    """
    now = time.time()
    root = Path(tempfile.gettempdir())
    try:
        candidates = sorted(root.glob(_TEMP_PREFIX + "*"))[:max_dirs]
    except OSError:
        return
    for path in candidates:
        pid_file = path / "broker.pid"
        try:
            if now - pid_file.stat().st_mtime < _STALE_AFTER_S:
                continue
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if _pid_alive(pid) and f"-Dthroughline.harness.workdir={path}" in _pid_cmdline(pid):
            continue
        shutil.rmtree(path, ignore_errors=True)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the broker's process group (it leads its own session), or the pid alone."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def start_broker(
    *,
    settings: BrokerSettings | None = None,
    work_dir: Path | str | None = None,
    report: Reporter | None = None,
    timeout_s: float | None = None,
) -> KafkaBroker:
    """Start a JVM :class:`KafkaBroker` (fetching jars if needed) and return it, ready."""
    broker = KafkaBroker(settings=settings, work_dir=work_dir, report=report)
    return broker.start(timeout_s=timeout_s)


@contextlib.contextmanager
def running_broker(
    *,
    settings: BrokerSettings | None = None,
    work_dir: Path | str | None = None,
    report: Reporter | None = None,
) -> Iterator[KafkaBroker]:
    """``with running_broker() as broker:`` -- a JVM broker for the duration of the block."""
    broker = start_broker(settings=settings, work_dir=work_dir, report=report)
    try:
        yield broker
    finally:
        broker.close()


# --------------------------------------------------------------------------------------------
# Docker (testcontainers)
# --------------------------------------------------------------------------------------------


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
        self._report = report or _stderr_reporter
        self._container: Any = None
        self._advertised_host, self._bind_ip = _docker_advertised_host()
        self._cluster_id = _random_cluster_id()
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
            with _LIVE_LOCK:
                _LIVE.add(self)
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
        with _LIVE_LOCK:
            _LIVE.discard(self)

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


# --------------------------------------------------------------------------------------------
# Choosing a provider
# --------------------------------------------------------------------------------------------


def provision_kafka(
    *,
    provider: str | None = None,
    report: Reporter | None = None,
    timeout_s: float | None = None,
) -> KafkaHandle:
    """Give the caller a ready broker: external if configured, else Docker if it answers, else a JVM.

    ``provider`` (or ``THROUGHLINE_KAFKA_PROVIDER``) may force ``external``, ``docker`` or ``jvm``.
    Call ``.close()`` on the result when done (a no-op for an external broker).
    """
    report = report or _stderr_reporter
    choice = (provider or os.environ.get(ENV_PROVIDER, "") or "auto").strip().lower()
    if choice not in {"auto", "external", "docker", "jvm"}:
        raise HarnessError(f"{ENV_PROVIDER}={choice!r}: expected auto, external, docker or jvm")

    external = os.environ.get(ENV_BOOTSTRAP, "").strip()
    if choice == "external" and not external:
        raise HarnessError(f"provider 'external' needs {ENV_BOOTSTRAP}=host:port")
    if choice in {"auto", "external"} and external:
        handle = ExternalKafka(bootstrap_servers=external)
        wait_for_kafka(external, timeout_s=timeout_s if timeout_s is not None else 30.0)
        return handle

    if choice in {"auto", "docker"}:
        if docker_available():
            return DockerKafka(startup_timeout_s=timeout_s, report=report).start()
        if choice == "docker":
            raise DockerUnavailableError(
                "provider 'docker' was requested but no Docker engine answered a ping"
            )

    return KafkaBroker(report=report).start(timeout_s=timeout_s)


def provision_private_kafka(
    *,
    provider: str | None = None,
    report: Reporter | None = None,
    timeout_s: float | None = None,
) -> KafkaBroker | DockerKafka:
    """A new broker owned by the caller, for tests that stop, kill or restart it.

    Unlike :func:`provision_kafka` this never returns the external broker: ``docker`` if forced
    or (under ``auto``/``external``) if an engine answers, else a JVM broker.
    """
    report = report or _stderr_reporter
    choice = (provider or os.environ.get(ENV_PROVIDER, "") or "auto").strip().lower()
    if choice == "jvm":
        return KafkaBroker(report=report).start(timeout_s=timeout_s)
    if docker_available():
        return DockerKafka(startup_timeout_s=timeout_s, report=report).start()
    if choice == "docker":
        raise DockerUnavailableError("provider 'docker' was requested but no Docker engine answered a ping")
    return KafkaBroker(report=report).start(timeout_s=timeout_s)


# --------------------------------------------------------------------------------------------
# Command line: a detached local broker
# --------------------------------------------------------------------------------------------


def default_state_dir() -> Path:
    """``$THROUGHLINE_KAFKA_STATE`` or ``./.cache/kafka-local``."""
    configured = os.environ.get(ENV_STATE, "").strip()
    return Path(configured).expanduser() if configured else Path.cwd() / ".cache" / "kafka-local"


def _read_state(state_dir: Path) -> BrokerState | None:
    try:
        return BrokerState.from_json((state_dir / _STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _state_process_alive(state: BrokerState) -> bool:
    """The recorded pid is alive *and* is our broker (not a recycled pid)."""
    if not _pid_alive(state.pid):
        return False
    cmdline = _pid_cmdline(state.pid)
    return "kafka.Kafka" in cmdline and f"-Dthroughline.harness.workdir={state.work_dir}" in cmdline


def _export_lines(bootstrap: str) -> str:
    return f"export THROUGHLINE_BOOTSTRAP_SERVERS={bootstrap}\nexport {ENV_BOOTSTRAP}={bootstrap}"


def _cli_start(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir).expanduser().resolve()
    state = _read_state(state_dir)
    if state is not None and _state_process_alive(state):
        _stderr_reporter(f"already running: pid {state.pid} at {state.bootstrap_servers}")
        print(_export_lines(state.bootstrap_servers))
        return 0
    (state_dir / _STATE_FILE).unlink(missing_ok=True)
    work_dir = state_dir / "work"
    if args.fresh and work_dir.exists():
        shutil.rmtree(work_dir)
    settings = BrokerSettings(port=args.port, keep_work_dir=True)
    broker = KafkaBroker(settings=settings, work_dir=work_dir, detached=True)
    resumed = (work_dir / "data" / "meta.properties").exists()
    broker.start(timeout_s=args.timeout)
    pid = broker.pid
    assert pid is not None
    new_state = BrokerState(
        pid=pid,
        bootstrap_servers=broker.bootstrap_servers,
        work_dir=str(broker.work_dir),
        port=broker.port,
        controller_port=broker.controller_port,
        started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / _STATE_FILE).write_text(new_state.to_json(), encoding="utf-8")
    _stderr_reporter(
        f"{'resumed' if resumed else 'started'} Kafka {KAFKA_VERSION} at {broker.bootstrap_servers} "
        f"(pid {pid}, {broker.last_startup_s or 0:.1f}s; logs in {broker.log_dir})"
    )
    print(_export_lines(broker.bootstrap_servers))
    return 0


def _cli_stop(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir).expanduser().resolve()
    state = _read_state(state_dir)
    if state is None:
        _stderr_reporter(f"no broker recorded in {state_dir}")
        return 0
    if _state_process_alive(state):
        broker = KafkaBroker(
            settings=BrokerSettings(keep_work_dir=False), work_dir=state.work_dir, detached=True
        )
        broker._pid = state.pid
        broker.stop(keep_data=args.keep_data)
        _stderr_reporter(f"stopped broker pid {state.pid} ({state.bootstrap_servers})")
    else:
        _stderr_reporter(f"broker pid {state.pid} was not running; clearing its state")
        if not args.keep_data:
            shutil.rmtree(state.work_dir, ignore_errors=True)
    (state_dir / _STATE_FILE).unlink(missing_ok=True)
    return 0


def _cli_status(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir).expanduser().resolve()
    state = _read_state(state_dir)
    if state is None:
        print(f"not running (no state in {state_dir})")
        return 3
    if not _state_process_alive(state):
        print(f"not running (stale state: pid {state.pid} is gone; `stop` clears it)")
        return 3
    print(
        f"running pid={state.pid} bootstrap={state.bootstrap_servers} "
        f"since={state.started_at} work_dir={state.work_dir}"
    )
    return 0


def _cli_fetch(args: argparse.Namespace) -> int:
    dist = fetch_kafka_jars(args.cache_dir)
    _stderr_reporter(
        f"Kafka {dist.kafka_version} jars ready in {dist.libs_dir} ({len(dist.jars)} jars; "
        f"slf4j-api {dist.jar_version('slf4j-api')}, log4j-slf4j-impl {dist.jar_version('log4j-slf4j-impl')}, "
        f"log4j-core {dist.jar_version('log4j-core')})"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m throughline.testing.kafka start|stop|status|fetch``."""
    parser = argparse.ArgumentParser(
        prog="python -m throughline.testing.kafka",
        description=f"A local Apache Kafka {KAFKA_VERSION} broker (from Maven Central jars) on 127.0.0.1.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def _with_state(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--state-dir",
            default=str(default_state_dir()),
            help=f"where the broker's state and data live (default ${ENV_STATE} or ./.cache/kafka-local)",
        )

    p_start = sub.add_parser("start", help="start a detached broker; prints `export ...` lines")
    _with_state(p_start)
    p_start.add_argument("--port", type=int, default=0, help="client port (default: a free one)")
    p_start.add_argument("--timeout", type=float, default=None, help="seconds to wait for readiness")
    p_start.add_argument("--fresh", action="store_true", help="discard data kept by `stop --keep-data`")
    p_start.set_defaults(func=_cli_start)

    p_stop = sub.add_parser("stop", help="stop the detached broker and delete its data")
    _with_state(p_stop)
    p_stop.add_argument("--keep-data", action="store_true", help="keep data; the next `start` resumes it")
    p_stop.set_defaults(func=_cli_stop)

    p_status = sub.add_parser("status", help="print whether the detached broker runs (exit 3 if not)")
    _with_state(p_status)
    p_status.set_defaults(func=_cli_status)

    p_fetch = sub.add_parser("fetch", help="only fetch the Kafka jars into the cache")
    p_fetch.add_argument(
        "--cache-dir", default=None, help=f"default ${ENV_CACHE} or ~/.cache/throughline/..."
    )
    p_fetch.set_defaults(func=_cli_fetch)

    args = parser.parse_args(argv)
    # kafka-python logs connection refusals while a broker boots; keep the CLI quiet.
    logging.getLogger("kafka").addHandler(logging.NullHandler())
    logging.getLogger("kafka").propagate = False
    try:
        result: int = args.func(args)
    except HarnessError as exc:
        _stderr_reporter(f"error: {exc}")
        return 1
    return result


if __name__ == "__main__":
    sys.exit(main())
