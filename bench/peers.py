"""Virtual environments of the benchmark's peers: programs the bench runs as subprocesses because they
cannot share the project's ``.venv``.

- ``quix``: the Quix Streams application of item 2 (``bench/quix_peer.py``). Quix Streams 3.28 pins
  ``pydantic<2.14`` and throughline needs a newer one, so it cannot be installed next to throughline.
- ``py-spy``: the sampling profiler behind the profiles of missed targets (a binary; not in the dev extra).
- ``loadgen``: librdkafka's Python client (``confluent-kafka``), the freshness sweep's load generator
  (``bench/freshness_rig.py``): the producer processes import it from this environment's
  ``site-packages`` (``PeerEnv.site_packages``), appended after throughline's own; it has no dependencies
  and its C extension is built for the interpreter that built the environment (the hash below covers it).

Each environment is built on first use, from pinned requirements, into
``~/.cache/throughline/bench-peers/NAME-HASH`` (``$THROUGHLINE_BENCH_PEERS`` names another folder), with
pip's output shown as progress. ``HASH`` covers the requirements and the interpreter, so a changed pin
builds a new environment beside the old one. A marker file written last says the build finished: an
interrupted build is removed and redone, never used half-built. A lock file keeps two bench runs from
building the same environment at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from bench.common import log

ENV_ROOT = "THROUGHLINE_BENCH_PEERS"
_MARKER = "bench-peer.json"
_BUILD_TIMEOUT_S = 900.0

#: Quix Streams and its Kafka client, as measured in the recorded runs.
QUIX_PINS = ("quixstreams==3.28.1", "confluent-kafka==2.12.2")
#: The profiler.
PY_SPY_PINS = ("py-spy==0.4.1",)
#: The freshness sweep's load generator: the Kafka client Quix Streams measured with (librdkafka).
LOADGEN_PINS = ("confluent-kafka==2.12.2",)
#: What the Quix app's deserializer and DuckDB sink use: pinned to the versions throughline runs with, so
#: that both sides of the comparison decode with the same fastavro and write with the same DuckDB.
_SHARED_WITH_THROUGHLINE = ("duckdb", "fastavro", "pyarrow")


class PeerEnvError(RuntimeError):
    """A peer's environment could not be built (no network, no pip, a failed install)."""


def root() -> Path:
    """Where peer environments live: ``$THROUGHLINE_BENCH_PEERS`` or ``~/.cache/throughline/bench-peers``."""
    configured = os.environ.get(ENV_ROOT, "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "throughline" / "bench-peers"


@dataclass(frozen=True)
class PeerEnv:
    """One pinned virtual environment, built on first use."""

    name: str
    requirements: tuple[str, ...]

    @property
    def key(self) -> str:
        """A short hash of the requirements and the interpreter that builds the environment."""
        text = "\n".join([*self.requirements, sys.version, platform.machine()])
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def path(self) -> Path:
        """The environment's folder."""
        return root() / f"{self.name}-{self.key}"

    def bin(self, program: str) -> Path:
        """A program in the environment's ``bin`` folder (exists only once the environment is built)."""
        return self.path / "bin" / program

    @property
    def python(self) -> Path:
        """The environment's interpreter."""
        return self.bin("python")

    @property
    def site_packages(self) -> Path:
        """The environment's ``site-packages`` folder (exists only once the environment is built)."""
        return self.path / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"

    def ready(self) -> bool:
        """Whether the environment is built completely."""
        return (self.path / _MARKER).is_file()

    def versions(self) -> dict[str, str]:
        """Installed distributions and versions (empty until built)."""
        try:
            doc = json.loads((self.path / _MARKER).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in doc.get("installed", {}).items()}

    def ensure(self) -> Path:
        """Build the environment unless it is already complete; return its folder."""
        if self.ready():
            return self.path
        root().mkdir(parents=True, exist_ok=True)
        with _locked(root() / f"{self.name}.lock"):
            if not self.ready():  # another run may have built it while this one waited
                self._build()
        return self.path

    def _build(self) -> None:
        target = self.path
        shutil.rmtree(target, ignore_errors=True)  # a build interrupted before its marker
        log(f"building the {self.name} peer environment (first use; pinned: {' '.join(self.requirements)}) in {target}")
        start = time.monotonic()
        _run([sys.executable, "-m", "venv", str(target)], f"{self.name}: venv")
        pip = [str(self.python), "-m", "pip", "--disable-pip-version-check", "--no-input"]
        _run([*pip, "install", "--progress-bar", "off", *self.requirements], f"{self.name}: pip")
        frozen = subprocess.run(
            [*pip, "list", "--format", "json"], capture_output=True, text=True, timeout=120, check=False
        )
        try:
            installed = {d["name"].lower(): d["version"] for d in json.loads(frozen.stdout)}
        except (ValueError, KeyError, TypeError):
            installed = {}
        doc = {"requirements": list(self.requirements), "installed": installed, "python": sys.version}
        (target / _MARKER).write_text(json.dumps(doc, indent=1, sort_keys=True), encoding="utf-8")
        log(f"{self.name} peer environment ready in {time.monotonic() - start:.0f} s")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(cmd: list[str], label: str) -> None:
    """Run a build step, showing its output line by line; raise ``PeerEnvError`` when it fails."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(_BUILD_TIMEOUT_S, proc.kill)  # a silent hang ends too
    watchdog.start()
    tail: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            if line:
                log(f"{label}: {line}")
                tail = (tail + [line])[-20:]
        rc = proc.wait(timeout=30)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    if rc != 0:
        raise PeerEnvError(f"{label} failed (exit {rc}): " + " | ".join(tail[-5:]))


def _throughline_pin(name: str) -> str:
    try:
        return f"{name}=={metadata.version(name)}"
    except metadata.PackageNotFoundError:  # pragma: no cover - throughline depends on all three
        return name


def quix() -> PeerEnv:
    """The Quix Streams application's environment."""
    return PeerEnv("quix", QUIX_PINS + tuple(_throughline_pin(n) for n in _SHARED_WITH_THROUGHLINE))


PY_SPY = PeerEnv("py-spy", PY_SPY_PINS)
LOADGEN = PeerEnv("loadgen", LOADGEN_PINS)
