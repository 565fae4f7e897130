"""Apache Kafka's jars from Maven Central: fetched once with ``mvn`` into a cache folder, then reused."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from throughline.testing.kafka.config import (
    ENV_BOOTSTRAP,
    ENV_CACHE,
    FETCH_LOCK_TIMEOUT_S,
    KAFKA_VERSION,
    MAVEN_TIMEOUT_S,
    SCALA_VERSION,
    Reporter,
    read_resource,
    stderr_reporter,
)
from throughline.testing.kafka.exceptions import MavenFetchError
from throughline.testing.kafka.support import run_tool

_POM_RESOURCE = "pom.xml"
_MARKER_NAME = ".complete.json"


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
def file_lock(path: Path, timeout_s: float, report: Reporter, *, what: str = "Kafka jars") -> Iterator[None]:
    """An exclusive ``flock`` on ``path``, waited for at most ``timeout_s`` (``what`` is being fetched)."""
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
                    report(f"waiting for another process fetching {what} (lock {path})")
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
    pom: Path | str | None = None,
) -> KafkaDistribution:
    """Fetch Apache Kafka 4.1.0 (and a log4j2 SLF4J binding) from Maven Central, once.

    Runs ``mvn -q -B dependency:copy-dependencies`` on the ``pom.xml`` shipped in this package, or on
    ``pom`` (another set of Kafka jars, such as the Kafka image's in ``images/kafka/pom.xml``; give it
    its own ``cache_dir``). A marker file holding the pom's hash makes it idempotent, and a lock file
    makes concurrent callers (pytest-xdist workers, two terminals) wait for one fetch instead of racing.
    """
    report = report or stderr_reporter
    root = Path(cache_dir).expanduser().resolve() if cache_dir is not None else kafka_cache_dir()
    pom_text = Path(pom).read_text(encoding="utf-8") if pom is not None else read_resource(_POM_RESOURCE)
    fingerprint = _pom_fingerprint(pom_text)
    found = _load_distribution(root, fingerprint)
    if found is not None:
        return found

    root.mkdir(parents=True, exist_ok=True)
    with file_lock(root / ".fetch.lock", FETCH_LOCK_TIMEOUT_S, report):
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
            proc = run_tool(cmd, cwd=work, timeout_s=timeout_s, what="`mvn`", error=MavenFetchError)
            if proc.returncode != 0:
                output = (proc.stdout + proc.stderr).decode(errors="replace").strip().splitlines()[-40:]
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
