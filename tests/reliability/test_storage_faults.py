"""Storage faults (docs/reliability.md#3-storage-faults): the projection's disk fills up, or its file turns read-only.

``throughline project`` runs on a DuckDB file while turns keep arriving; then its storage fails. The
mechanisms are real, picked by what the test may do here (the one used is reported):

- **disk full**: the file lives on a small tmpfs mounted for the test, which is then filled to the
  last byte; without the privilege to mount, the projector runs under ``RLIMIT_FSIZE`` (any write past
  a size fails with ``EFBIG``);
- **read-only while running**: the file, its WAL and its folder are made immutable (``chattr +i``:
  writes through descriptors already open fail too); else the folder is bind-mounted read-only over
  itself; else (no privileges) the folder and file lose their write permission;
- **read-only at start**: the projector is started on the read-only file.

Each time the projector must stop on its own (bounded), with a clear message (a JSON error on stderr,
no traceback, naming what failed), without advancing its offsets past the rows it wrote (the file
equals a ``ChainBook`` fold of exactly the log prefix its applied offsets name); and once the storage
is writable again, a new run resumes and ends equal to the fold of the whole log.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import rel_support
from rel_support import (
    Child,
    Workload,
    check_applied_prefix,
    check_projection,
    fold_log,
    last_error,
    wait_until,
)
from support.topic import read_topic_and_ends

from throughline.log import ensure_topic
from throughline.producers.producer import TurnProducer

pytestmark = pytest.mark.integration

PARTITIONS = 3
PROJECTS = ("/srv/storage/a", "/srv/storage/b", "/srv/storage/c")
FAIL_TIMEOUT = 90.0
#: A person must be told what failed: one of these appears in the error of a stopped projector.
STORAGE_WORDS = ("no space", "read-only", "permission", "not permitted", "file too large", "disk", "cannot write")


# ------------------------------------------------------------------------------------------ mechanisms


def _run(*argv: str) -> bool:
    if shutil.which(argv[0]) is None:
        return False
    return subprocess.run(list(argv), capture_output=True, check=False).returncode == 0


def _mount_tmpfs(where: Path, size_mb: int) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    return os.geteuid() == 0 and _run("mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", str(where))


def _umount(where: Path) -> None:
    _run("umount", "-l", str(where))


def _fill(folder: Path) -> Path:
    """Fill the file system of ``folder`` to the last byte; returns the filler file."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (1 << 20, 1 << 12, 1):
            block = b"\0" * size
            while True:
                try:
                    f.write(block)
                except OSError:
                    break
    return filler


def _fsize_limit(limit: int) -> Callable[[], None]:
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    return preexec


def _write_fails(path: Path) -> bool:
    try:
        with open(path, "a") as f:
            f.write("y")
    except OSError:
        return True
    return False


class ReadOnly:
    """Makes a projection's folder and files read-only, by the strongest mechanism available."""

    def __init__(self, folder: Path, scratch: Path) -> None:
        self.folder = folder
        self.mechanism = self._pick(scratch)
        self.active = False

    @staticmethod
    def _pick(scratch: Path) -> str:
        forced = os.environ.get("THROUGHLINE_READ_ONLY_MECHANISM", "").strip()
        if forced:  # to exercise a weaker mechanism on a machine that has a stronger one
            return forced
        probe = scratch / "probe"
        probe.write_text("x")
        try:
            if _run("chattr", "+i", str(probe)):
                works = _write_fails(probe)
                _run("chattr", "-i", str(probe))
                if works:
                    return "chattr"
            if os.geteuid() == 0:
                return "bind-mount"
            return "chmod"
        finally:
            probe.unlink()

    @property
    def description(self) -> str:
        return {
            "chattr": "chattr +i on the file, its WAL and its folder",
            "bind-mount": "the folder bind-mounted read-only over itself",
            "chmod": "the folder and file without write permission",
        }[self.mechanism]

    def _paths(self) -> list[str]:
        return [str(p) for p in (*self.folder.iterdir(), self.folder) if p.exists()]

    def on(self) -> None:
        if self.mechanism == "chattr":
            assert _run("chattr", "+i", *self._paths())
        elif self.mechanism == "bind-mount":
            assert _run("mount", "--bind", str(self.folder), str(self.folder))
            assert _run("mount", "-o", "remount,bind,ro", str(self.folder))
        else:
            for p in self.folder.iterdir():
                p.chmod(0o444)
            self.folder.chmod(0o555)
        self.active = True

    def off(self) -> None:
        if not self.active:
            return
        if self.mechanism == "chattr":
            _run("chattr", "-i", *self._paths())
        elif self.mechanism == "bind-mount":
            _run("umount", "-l", str(self.folder))
        else:
            self.folder.chmod(0o755)
            for p in self.folder.iterdir():
                p.chmod(0o644)
        self.active = False


# ------------------------------------------------------------------------------------------ checks


def _produce(bootstrap: str, topic: str, workload: Workload, n: int, body_bytes: int = 0) -> None:
    with TurnProducer(bootstrap, topic, partitions=PARTITIONS) as producer:
        turns = [workload.next_turn(PROJECTS[i % len(PROJECTS)], body_bytes=body_bytes) for i in range(n)]
        for start in range(0, n, 200):
            producer.send_many(turns[start : start + 200])


def _prefix_check(bootstrap: str, topic: str, db: Path) -> int:
    """The file equals the fold of exactly the log prefix its applied offsets name; the applied total."""
    return sum(check_applied_prefix(bootstrap, topic, db, PARTITIONS).values())


def _full_check(bootstrap: str, topic: str, db: Path) -> int:
    stored, ends = read_topic_and_ends(bootstrap, topic)
    check_projection(db, fold_log(stored, PARTITIONS), ends, topic=topic)
    return len(stored)


def _stopped_clearly(child: Child) -> dict[str, str]:
    """The projector stopped on its own, non-zero, with a JSON error that names the storage fault."""
    code = child.wait(FAIL_TIMEOUT)
    stderr = child.stderr(limit=20_000)
    assert code not in (0, -signal.SIGKILL), f"projector exit {code}:\n{stderr}"
    assert "Traceback" not in stderr, (
        f"the projector stopped with a traceback, not an error document:\n{stderr[-3000:]}"
    )
    error = last_error(stderr)
    assert error is not None, f"the projector stopped without a JSON error on stderr:\n{stderr[-3000:]}"
    text = f"{error['code']} {error['message']}".lower()
    assert any(word in text for word in STORAGE_WORDS), f"the error does not say what failed: {error}"
    return error


def _status_says_behind(folder: Path, env: dict[str, str], db: Path, applied: int, *, caught_up: bool = False) -> int:
    """``throughline status`` on the stopped projection: its applied offsets, and the lag behind the log."""
    code, doc = rel_support.status_json(folder, env, db)
    assert code == 0 and doc is not None, (code, doc)
    assert doc["log"]["reachable"] and sum(p["applied"] for p in doc["partitions"]) == applied, doc
    if caught_up:
        assert doc["lag"] == 0, doc
    else:
        assert doc["lag"] > 0, doc  # the records the storage refused are reported as lag
    return int(doc["lag"])


def _running(child: Child) -> Child:
    wait_until(
        lambda: "projecting topic" in child.stderr(limit=200_000) or not child.alive(),
        timeout=60,
        what=f"{child.name} to run",
    )
    assert child.alive(), child.stderr()
    return child


_CATCH_UP = ["project", "--until-caught-up", "--db"]


@pytest.fixture
def env(kafka_bootstrap: str, kafka_topic_name: str) -> dict[str, str]:
    """The children's environment, naming the test's topic (created here)."""
    ensure_topic(kafka_bootstrap, kafka_topic_name, partitions=PARTITIONS)
    return rel_support.child_env(THROUGHLINE_BOOTSTRAP_SERVERS=kafka_bootstrap, THROUGHLINE_TOPIC=kafka_topic_name)


def _catch_up(name: str, db: Path, tmp_path: Path, env: dict[str, str], timeout: float) -> None:
    """A ``project --until-caught-up`` run that must exit 0 within ``timeout`` seconds."""
    child = Child(name, [*_CATCH_UP, str(db)], tmp_path, env).start()
    assert child.wait(timeout) == 0, child.stderr()


# ------------------------------------------------------------------------------------------ tests


def test_disk_full_stops_the_projector_cleanly_and_it_resumes(
    kafka_bootstrap: str, kafka_topic_name: str, env: dict[str, str], tmp_path: Path
) -> None:
    topic = kafka_topic_name
    disk = tmp_path / "disk"
    # THROUGHLINE_DISK_FULL_MECHANISM=rlimit exercises the fallback on a machine that may mount.
    mounted = os.environ.get("THROUGHLINE_DISK_FULL_MECHANISM") != "rlimit" and _mount_tmpfs(disk, 48)
    disk.mkdir(exist_ok=True)
    db = disk / "p.duckdb"
    workload = Workload(11, PROJECTS, switch_every=5, rollback_every=7)
    filler: Path | None = None
    try:
        _produce(kafka_bootstrap, topic, workload, 300)
        _catch_up("first", db, tmp_path, env, 120)
        argv = ["project", "-v", "--db", str(db)]
        if mounted:
            runner = _running(Child("projector", argv, tmp_path, env).start())
            filler = _fill(disk)
            mechanism = "a 48 MB tmpfs filled to the last byte"
        else:
            limit = os.path.getsize(db) + 64 * 1024
            runner = _running(Child("projector", argv, tmp_path, env, preexec=_fsize_limit(limit)).start())
            mechanism = "RLIMIT_FSIZE on the projector (no privilege to mount a tmpfs)"
        _produce(kafka_bootstrap, topic, workload, 400, body_bytes=16_000)  # ~6 MB to write
        error = _stopped_clearly(runner)
        applied_at_failure = _prefix_check(kafka_bootstrap, topic, db)
        behind = _status_says_behind(tmp_path, env, db, applied_at_failure)
        if filler is not None:
            filler.unlink()  # space is back
            filler = None
        _catch_up("resumed", db, tmp_path, env, 180)
        records = _full_check(kafka_bootstrap, topic, db)
        assert _status_says_behind(tmp_path, env, db, records, caught_up=True) == 0
    finally:
        if mounted:
            _umount(disk)
    assert records > applied_at_failure  # the resumed run applied what the full disk had refused
    print(f"\ndisk full ({mechanism}): stopped with {error['code']}: {error['message'][:200]}")
    rel_support.record(
        "storage",
        "disk_full",
        mechanism=mechanism,
        faults=1,
        stopped_cleanly=1,
        offsets_advanced_past_rows=0,
        resumed=1,
        lost=0,
        doubled=0,
        unhandled=0,
        error_codes=[error["code"]],
        records=records,
        status_lag_after_failure=behind,
    )


def test_read_only_projection_stops_the_projector_cleanly_and_it_resumes(
    kafka_bootstrap: str, kafka_topic_name: str, env: dict[str, str], tmp_path: Path
) -> None:
    topic = kafka_topic_name
    folder = tmp_path / "store"
    folder.mkdir()
    db = folder / "p.duckdb"
    read_only = ReadOnly(folder, tmp_path)
    workload = Workload(12, PROJECTS, switch_every=5, rollback_every=7)
    errors: list[dict[str, str]] = []
    try:
        _produce(kafka_bootstrap, topic, workload, 300)
        _catch_up("first", db, tmp_path, env, 120)

        # 1. Read-only under a running projector (its next commit cannot be written).
        runner = _running(Child("projector", ["project", "-v", "--db", str(db)], tmp_path, env).start())
        read_only.on()
        _produce(kafka_bootstrap, topic, workload, 300, body_bytes=2_000)
        errors.append(_stopped_clearly(runner))
        read_only.off()
        applied = _prefix_check(kafka_bootstrap, topic, db)
        behind = _status_says_behind(tmp_path, env, db, applied)

        # 2. Read-only at start: refused at once, and nothing changes.
        _produce(kafka_bootstrap, topic, workload, 100)
        read_only.on()
        at_start = Child("at-start", [*_CATCH_UP, str(db)], tmp_path, env).start()
        errors.append(_stopped_clearly(at_start))
        read_only.off()
        assert _prefix_check(kafka_bootstrap, topic, db) == applied

        # 3. Writable again: a new run resumes and catches up.
        _catch_up("resumed", db, tmp_path, env, 180)
        records = _full_check(kafka_bootstrap, topic, db)
        assert _status_says_behind(tmp_path, env, db, records, caught_up=True) == 0
    finally:
        with contextlib.suppress(Exception):
            read_only.off()
    print(f"\nread-only ({read_only.description}): " + "; ".join(f"{e['code']}: {e['message'][:160]}" for e in errors))
    rel_support.record(
        "storage",
        "read_only",
        mechanism=read_only.description,
        faults=len(errors),
        stopped_cleanly=len(errors),
        offsets_advanced_past_rows=0,
        resumed=1,
        lost=0,
        doubled=0,
        unhandled=0,
        error_codes=sorted({e["code"] for e in errors}),
        records=records,
        status_lag_after_failure=behind,
    )
