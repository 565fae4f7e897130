"""A real schema registry for the tests: Apicurio Registry's server, from Maven Central, on loopback.

Apicurio Registry publishes its server as a built Quarkus application beside its jar:
``io.apicurio:apicurio-registry-app:<version>:tar.gz:all`` (the ``fast-jar`` layout: ``quarkus-run.jar``
with ``lib/``, ``app/`` and ``quarkus/``). :func:`fetch_apicurio` copies that archive once with ``mvn``
into a cache folder and unpacks it; :class:`ApicurioRegistry` runs it as a child ``java`` process on
free loopback ports, storing in memory (its default: an in-process H2 database, gone when it stops),
and serves Confluent's Schema Registry REST API at :data:`CCOMPAT_PATH`.

Like the JVM broker, the process carries ``-Dthroughline.harness.tag=$THROUGHLINE_HARNESS_TAG`` so that
CI's clean-up finds it, leads its own session (stopped as a group) and dies with its parent.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from throughline.runtime import die_with_parent_preexec
from throughline.testing.kafka.config import (
    DEFAULT_STOP_TIMEOUT_S,
    ENV_HARNESS_TAG,
    FETCH_LOCK_TIMEOUT_S,
    LOOPBACK,
    MAVEN_TIMEOUT_S,
    Reporter,
    stderr_reporter,
)
from throughline.testing.kafka.exceptions import JavaNotFoundError, MavenFetchError, RegistryStartError
from throughline.testing.kafka.maven import file_lock
from throughline.testing.kafka.support import free_ports, run_tool

APICURIO_VERSION = "3.3.3"
#: The built server: Maven coordinates group:artifact:version:type:classifier.
APICURIO_ARTIFACT = f"io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:tar.gz:all"
#: Where Apicurio serves Confluent's Schema Registry API (its "ccompat" API, version 7).
CCOMPAT_PATH = "/apis/ccompat/v7"
ENV_REGISTRY_CACHE = "THROUGHLINE_REGISTRY_CACHE"
#: A registry somebody else runs (its Confluent-compatible base URL): the tests use it instead.
ENV_TEST_REGISTRY = "THROUGHLINE_TEST_SCHEMA_REGISTRY"
#: Apicurio Registry 3.3 is built for Java 21 (class files of version 65); the brokers run on Java 17.
APICURIO_MIN_JAVA = 21
#: A JDK (or JRE) folder to run the registry with, when the default ``java`` is older than Java 21.
ENV_REGISTRY_JAVA_HOME = "THROUGHLINE_REGISTRY_JAVA_HOME"
#: A cold start on 2 busy cores takes 10-30 s (Quarkus, Hibernate-free SQL storage on H2).
DEFAULT_REGISTRY_STARTUP_S = 180.0
_MARKER_NAME = ".complete.json"
# A pinned dependency plugin: Maven 3.8 would otherwise take an old 2.x one.
_COPY_GOAL = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy"


@dataclass(frozen=True)
class ApicurioDistribution:
    """An unpacked Apicurio Registry server in a cache folder (as :func:`fetch_apicurio` leaves it)."""

    root: Path
    version: str

    @property
    def run_jar(self) -> Path:
        """The Quarkus launcher, ``java -jar`` it."""
        return self.root / "app" / "quarkus-run.jar"


def apicurio_cache_dir() -> Path:
    """``$THROUGHLINE_REGISTRY_CACHE`` or ``~/.cache/throughline/apicurio-registry-<version>``."""
    configured = os.environ.get(ENV_REGISTRY_CACHE, "").strip()
    if configured:
        return Path(configured).expanduser().resolve()
    return Path.home() / ".cache" / "throughline" / f"apicurio-registry-{APICURIO_VERSION}"


def _load(root: Path) -> ApicurioDistribution | None:
    try:
        meta = json.loads((root / _MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    dist = ApicurioDistribution(root=root, version=APICURIO_VERSION)
    if meta.get("artifact") != APICURIO_ARTIFACT or not dist.run_jar.is_file():
        return None
    return dist


def fetch_apicurio(
    cache_dir: Path | str | None = None, *, report: Reporter | None = None, timeout_s: float = MAVEN_TIMEOUT_S
) -> ApicurioDistribution:
    """Copy Apicurio Registry's built server from Maven Central with ``mvn`` and unpack it, once
    (a marker names the artifact; a lock makes concurrent callers wait for one fetch)."""
    report = report or stderr_reporter
    root = Path(cache_dir).expanduser().resolve() if cache_dir is not None else apicurio_cache_dir()
    found = _load(root)
    if found is not None:
        return found
    root.mkdir(parents=True, exist_ok=True)
    with file_lock(root / ".fetch.lock", FETCH_LOCK_TIMEOUT_S, report, what="Apicurio Registry"):
        found = _load(root)
        if found is not None:
            return found
        mvn = os.environ.get("THROUGHLINE_MVN") or shutil.which("mvn")
        if not mvn:
            raise MavenFetchError("Maven (`mvn`) is not on PATH, so Apicurio Registry cannot be fetched")
        report(f"fetching Apicurio Registry {APICURIO_VERSION} ({APICURIO_ARTIFACT}) into {root} (one-time) ...")
        started = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=".fetch-", dir=root))
        try:
            cmd = [mvn, "-q", "-B", "-Dstyle.color=never", _COPY_GOAL, f"-Dartifact={APICURIO_ARTIFACT}"]
            cmd.append(f"-DoutputDirectory={work}")
            proc = run_tool(cmd, cwd=work, timeout_s=timeout_s, what="`mvn`", error=MavenFetchError)
            archives = sorted(work.glob("*.tar.gz"))
            if proc.returncode != 0 or len(archives) != 1:
                output = (proc.stdout + proc.stderr).decode(errors="replace").strip().splitlines()[-40:]
                raise MavenFetchError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}):\n" + "\n".join(output))
            unpacked = work / "app"
            with tarfile.open(archives[0], "r:gz") as archive:
                archive.extractall(unpacked, filter="data")
            if not (unpacked / "quarkus-run.jar").is_file():
                raise MavenFetchError(f"{APICURIO_ARTIFACT} holds no quarkus-run.jar (unpacked in {unpacked})")
            shutil.rmtree(root / "app", ignore_errors=True)
            unpacked.rename(root / "app")
            marker = {"artifact": APICURIO_ARTIFACT, "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            (root / (_MARKER_NAME + ".tmp")).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
            (root / (_MARKER_NAME + ".tmp")).replace(root / _MARKER_NAME)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        report(f"fetched Apicurio Registry {APICURIO_VERSION} in {time.monotonic() - started:.1f}s")
        return ApicurioDistribution(root=root, version=APICURIO_VERSION)


def _java_major(java_home: Path) -> int:
    """The major version a Java home's ``release`` file names (0: none readable)."""
    try:
        text = (java_home / "release").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return 0
    found = re.search(r'^JAVA_VERSION="(1\.)?(\d+)', text, re.MULTILINE)
    return int(found.group(2)) if found else 0


def find_registry_java() -> str:
    """A ``java`` of Java 21 or newer: ``$THROUGHLINE_REGISTRY_JAVA_HOME``, ``$JAVA_HOME``, the ``java``
    on ``PATH``, then the newest under ``/usr/lib/jvm`` (where Debian and Temurin packages install)."""
    homes: list[Path] = []
    for name in (ENV_REGISTRY_JAVA_HOME, "JAVA_HOME"):
        if os.environ.get(name, "").strip():
            homes.append(Path(os.environ[name].strip()))
    on_path = shutil.which("java")
    if on_path:
        homes.append(Path(os.path.realpath(on_path)).parent.parent)
    homes += sorted((Path(p) for p in glob.glob("/usr/lib/jvm/*")), key=_java_major, reverse=True)
    for home in homes:
        java = home / "bin" / "java"
        if _java_major(home) >= APICURIO_MIN_JAVA and java.is_file() and os.access(java, os.X_OK):
            return str(java)
    seen = ", ".join(f"{h} ({_java_major(h) or '?'})" for h in homes) or "none"
    raise JavaNotFoundError(
        f"Apicurio Registry {APICURIO_VERSION} needs Java {APICURIO_MIN_JAVA}+; none found (looked at {seen}). "
        f"Install one and set {ENV_REGISTRY_JAVA_HOME}, or point {ENV_TEST_REGISTRY} at a running registry."
    )


class ApicurioRegistry:
    """Apicurio Registry's server in a child ``java`` process on 127.0.0.1.

    ``port`` 0 picks a free one at :meth:`start`. :attr:`url` is the Confluent-compatible base URL.
    Storage is in memory (a stop loses every schema) unless ``on_disk``: then an H2 database file in
    the work folder, so that a :meth:`stop` and :meth:`start` bring the same registry back, with its
    schemas and ids, on the same port (a registry outage); :meth:`close` removes it.
    """

    def __init__(
        self, *, port: int = 0, on_disk: bool = False, report: Reporter | None = None, heap_max: str = "384m"
    ) -> None:
        self._port = port
        self._on_disk = on_disk
        self._report = report or stderr_reporter
        self._heap_max = heap_max
        self._proc: subprocess.Popen[bytes] | None = None
        self._work_dir: Path | None = None
        self.last_startup_s: float | None = None

    @property
    def port(self) -> int:
        """The HTTP port (0 until the first start when none was given)."""
        return self._port

    @property
    def url(self) -> str:
        """The base URL of Confluent's Schema Registry API."""
        return f"http://{LOOPBACK}:{self._port}{CCOMPAT_PATH}"

    @property
    def log_path(self) -> Path | None:
        """The server's console output (``None`` before the first start)."""
        return None if self._work_dir is None else self._work_dir / "registry.log"

    def describe(self) -> str:
        """One line: what runs where, and where its log is."""
        storage = f"H2 file in {self._work_dir}" if self._on_disk else "in memory"
        return f"Apicurio Registry {APICURIO_VERSION} at {self.url} ({storage}; log {self.log_path})"

    def is_running(self) -> bool:
        """Whether the process runs."""
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> ApicurioRegistry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, *, timeout_s: float = DEFAULT_REGISTRY_STARTUP_S) -> ApicurioRegistry:
        """Start the server (fetching it on first use) and wait, bounded, until its API answers."""
        if self.is_running():
            return self
        dist = fetch_apicurio(report=self._report)
        if self._work_dir is None:
            self._work_dir = Path(tempfile.mkdtemp(prefix="throughline-registry-"))
        http_port, management_port = free_ports(2)
        self._port = self._port or http_port
        cmd = [find_registry_java(), *self._jvm_args(management_port), "-jar", str(dist.run_jar)]
        started = time.monotonic()
        assert self.log_path is not None
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                cmd,
                cwd=self._work_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                preexec_fn=die_with_parent_preexec(signal.SIGTERM),
            )
        try:
            self._wait_ready(started + timeout_s)
        except BaseException:
            self.stop(graceful=False)
            raise
        self.last_startup_s = time.monotonic() - started
        return self

    def _jvm_args(self, management_port: int) -> list[str]:
        args = [
            "-Xms64m",
            f"-Xmx{self._heap_max}",
            "-XX:TieredStopAtLevel=1",  # a short-lived test server: start fast rather than peak
            "-Djava.net.preferIPv4Stack=true",
            f"-Dquarkus.http.host={LOOPBACK}",
            f"-Dquarkus.http.port={self._port}",
            f"-Dquarkus.management.host={LOOPBACK}",
            f"-Dquarkus.management.port={management_port}",
            "-Dquarkus.http.access-log.enabled=false",
            "-Dquarkus.log.level=WARN",
            f"-Djava.io.tmpdir={self._work_dir}",
            f"-Dthroughline.harness.workdir={self._work_dir}",
        ]
        if self._on_disk:
            args.append(f"-Dapicurio.datasource.url=jdbc:h2:file:{self._work_dir}/registry-db")
        tag = os.environ.get(ENV_HARNESS_TAG, "").strip()
        if tag:
            args.append(f"-Dthroughline.harness.tag={tag}")
        return args

    def _wait_ready(self, deadline: float) -> None:
        probe = self.url + "/subjects"
        last = "no answer yet"
        while time.monotonic() < deadline:
            if not self.is_running():
                raise RegistryStartError(f"Apicurio Registry exited during start-up:\n{self.diagnostics()}")
            try:
                with urllib.request.urlopen(probe, timeout=2) as resp:
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                last = str(getattr(exc, "reason", exc))
            time.sleep(0.25)
        raise RegistryStartError(f"Apicurio Registry did not answer {probe} in time ({last}):\n{self.diagnostics()}")

    def diagnostics(self, lines: int = 40) -> str:
        """The last lines of the server's console output."""
        path = self.log_path
        if path is None or not path.exists():
            return "(no log)"
        text = path.read_bytes()[-64 * 1024 :].decode("utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, *, graceful: bool = True, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        """Stop the process group: SIGTERM, then SIGKILL after ``timeout_s`` (at once unless ``graceful``)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL) if graceful else (signal.SIGKILL,):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=timeout_s if sig == signal.SIGTERM else 10)
                return
            except subprocess.TimeoutExpired:
                continue

    def close(self) -> None:
        """Stop the server and remove its work folder (its log with it)."""
        self.stop()
        if self._work_dir is not None:
            shutil.rmtree(self._work_dir, ignore_errors=True)
            self._work_dir = None
