"""The JVM broker: Apache Kafka 4.x as a combined KRaft broker+controller in a child ``java`` process."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from string import Template

from throughline.runtime import die_with_parent_preexec
from throughline.testing.kafka.admin import wait_for_kafka
from throughline.testing.kafka.config import (
    DEFAULT_STOP_TIMEOUT_S,
    ENV_BOOTSTRAP,
    ENV_HARNESS_TAG,
    ENV_KEEP_WORKDIR,
    ENV_LOG_LEVEL,
    FORMAT_TIMEOUT_S,
    KAFKA_VERSION,
    LOOPBACK,
    Reporter,
    env_flag,
    read_resource,
    startup_timeout_s,
    stderr_reporter,
)
from throughline.testing.kafka.exceptions import BrokerStartError, HarnessError, JavaNotFoundError
from throughline.testing.kafka.handle import OwnedBroker, discard_live, register_live
from throughline.testing.kafka.maven import KafkaDistribution, fetch_kafka_jars
from throughline.testing.kafka.support import free_ports, random_cluster_id, run_tool

_LOG4J_RESOURCE = "log4j2.xml"
_SERVER_TEMPLATE_RESOURCE = "kafka-server-template.properties"
_BROKER_META = "broker-meta.json"


def _tail(path: Path, lines: int = 40) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    text = data[-64 * 1024 :].decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
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


def pid_cmdline(pid: int) -> list[str]:
    """The command line of process ``pid`` (empty if it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", errors="replace") for part in raw.split(b"\0") if part]


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


class KafkaBroker(OwnedBroker):
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
        cluster_id: str | None = None,
    ) -> None:
        """Configure a broker; nothing starts until :meth:`start`.

        ``work_dir`` defaults to a fresh temporary folder. If it holds the metadata of an earlier
        broker (``broker-meta.json``), that broker's ports and cluster id are reused.
        ``detached`` brokers outlive this Python process (no atexit stop, no parent-death signal).
        ``cluster_id``: the KRaft cluster id to format a new data directory with (the nodes of one
        cluster share it; default a random one).
        """
        self.settings = settings or BrokerSettings()
        self._distribution = distribution
        self._detached = detached
        self._report = report or stderr_reporter
        self._work_dir: Path | None = Path(work_dir).resolve() if work_dir is not None else None
        self._port = self.settings.port
        self._controller_port = self.settings.controller_port
        self._cluster_id: str | None = cluster_id
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid: int | None = None
        self._launched_at = time.monotonic()
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

    def adopt(self, pid: int) -> None:
        """Take charge of a detached broker started earlier (by another process) on this work dir."""
        self._proc = None
        self._pid = pid

    def is_running(self) -> bool:
        """Whether the broker's JVM is alive (it may not be ready yet)."""
        if self._proc is not None:
            return self._proc.poll() is None
        return self._pid is not None and pid_alive(self._pid)

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
            parts.append(f"--- first ERROR lines of {self.log_dir / 'broker.log'} ---\n" + "\n".join(errors[:5]))
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

    def start(self, *, timeout_s: float | None = None, wait: bool = True) -> KafkaBroker:
        """Start the JVM (formatting storage on first start) and wait until it answers.

        ``wait=False`` returns once the JVM is launched (the nodes of a cluster answer only once a
        quorum of them runs): :meth:`wait_ready` then waits.
        """
        if self.is_running():
            return self
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
                preexec_fn=None if self._detached else die_with_parent_preexec(signal.SIGTERM),
            )
        self._pid = self._proc.pid
        self._launched_at = started
        (self.work_dir / "broker.pid").write_text(f"{self._pid}\n")
        if not self._detached:
            register_live(self)
        if wait:
            self.wait_ready(timeout_s=timeout_s)
        return self

    def wait_ready(self, *, timeout_s: float | None = None) -> float:
        """Wait (bounded) until the launched JVM answers; a broker that never does is killed. The
        seconds since its launch."""
        timeout_s = timeout_s if timeout_s is not None else self.settings.startup_timeout_s
        timeout_s = startup_timeout_s() if timeout_s is None else timeout_s
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
        self.last_startup_s = time.monotonic() - self._launched_at
        return self.last_startup_s

    def stop(self, *, keep_data: bool = False, graceful: bool = True, timeout_s: float | None = None) -> None:
        """Stop the JVM: SIGTERM, wait (15 s), then SIGKILL. ``graceful=False`` sends SIGKILL at once.

        With ``keep_data=True`` the work dir stays so that :meth:`start` brings the same broker
        back; otherwise it is removed (unless ``keep_work_dir``/``THROUGHLINE_KAFKA_KEEP_WORKDIR``).
        """
        self._terminate(graceful=graceful, timeout_s=timeout_s or self.settings.stop_timeout_s)
        if keep_data:
            return
        discard_live(self)
        if self._work_dir is not None and not self._keep_work_dir():
            shutil.rmtree(self._work_dir, ignore_errors=True)

    # -- internals ----------------------------------------------------------------------------

    def _keep_work_dir(self) -> bool:
        if self.settings.keep_work_dir is not None:
            return self.settings.keep_work_dir
        return env_flag(ENV_KEEP_WORKDIR)

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
            picked = free_ports(2, self.settings.host)
            self._port = self._port or picked[0]
            self._controller_port = self._controller_port or picked[1]
        if self._cluster_id is None:
            self._cluster_id = random_cluster_id()
        template = Template(read_resource(_SERVER_TEMPLATE_RESOURCE))
        text = template.substitute(
            host=self.settings.host,
            port=self._port,
            controller_port=self._controller_port,
            data_dir=str(self.data_dir),
            auto_create_topics="true" if self.settings.auto_create_topics else "false",
        )
        if self.settings.extra_properties:
            text += "\n# extra properties\n" + "".join(f"{k}={v}\n" for k, v in self.settings.extra_properties)
        self._properties_path.write_text(text, encoding="utf-8")
        (self._work_dir / "log4j2.xml").write_text(read_resource(_LOG4J_RESOURCE), encoding="utf-8")
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
        proc = run_tool(
            cmd, cwd=self.work_dir, timeout_s=FORMAT_TIMEOUT_S, what="formatting KRaft storage", error=BrokerStartError
        )
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
        if pid_alive(pid) and f"-Dthroughline.harness.workdir={path}" in pid_cmdline(pid):
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
