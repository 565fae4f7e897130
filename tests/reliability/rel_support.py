"""Shared helpers of the reliability suite (not a test module).

- ``record`` / ``REPORT``: the counts every test reports (printed by ``conftest.py``, written to JSON
  for ``scripts/reliability-run``);
- ``env_int`` / ``env_float``: the scale knobs (CI runs the defaults; the recorded run scales up);
- ``Workload``: deterministic turns over several projects, hosts and threads, with rollbacks;
- ``fold_log``: a ``ChainBook`` fold of the records ``support.topic.read_topic_and_ends`` reads back;
- ``check_projection``: a DuckDB projection file against a ``ChainBook`` fold of the same log;
- ``Child``: a ``throughline`` subprocess that can be SIGKILLed and restarted.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.topic import Stored, read_topic_and_ends

from throughline.core.fold import ChainBook
from throughline.core.identity import project_sha256
from throughline.core.partitioning import partition_for
from throughline.core.turn import TurnRecord, build_turn
from throughline.errors import ThroughlineError
from throughline.producers.producer import TurnProducer
from throughline.schemas.codec import decode_turn
from throughline.schemas.exceptions import RecordDecodeError

ENV_REPORT = "THROUGHLINE_RELIABILITY_REPORT"
REPO = Path(__file__).resolve().parents[2]

#: item -> target -> counter -> value. Items are the rows of docs/reliability.md.
REPORT: dict[str, dict[str, dict[str, Any]]] = {}
_REPORT_LOCK = threading.Lock()


def record(item: str, target: str, **counts: Any) -> None:
    """Add ``counts`` to ``REPORT[item][target]`` (numbers add up; anything else is replaced)."""
    with _REPORT_LOCK:
        entry = REPORT.setdefault(item, {}).setdefault(target, {})
        for key, value in counts.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                entry[key] = value
            else:
                entry[key] = entry.get(key, 0) + value


def summary_lines() -> list[str]:
    """The report as lines for a person."""
    lines = []
    for item in sorted(REPORT):
        for target in sorted(REPORT[item]):
            counts = ", ".join(f"{k}={_short(v)}" for k, v in sorted(REPORT[item][target].items()))
            lines.append(f"{item} / {target}: {counts}")
    return lines


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 120 else text[:117] + "..."


def env_int(name: str, default: int) -> int:
    """An integer knob from the environment (the default when unset or empty)."""
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default


def env_float(name: str, default: float) -> float:
    """A number knob from the environment (the default when unset or empty)."""
    raw = os.environ.get(name, "").strip()
    return float(raw) if raw else default


def fuzz_scale() -> float:
    """``THROUGHLINE_FUZZ_SCALE`` (default 1): multiplies every fuzz target's example count."""
    return max(0.01, env_float("THROUGHLINE_FUZZ_SCALE", 1.0))


def child_env(**extra: str) -> dict[str, str]:
    """The environment of child processes: no throughline settings of the developer, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("THROUGHLINE_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


# ------------------------------------------------------------------------------------------ workload

BASE_MICROS = 1_790_000_000_000_000


@dataclass
class Workload:
    """Deterministic turns (seeded): projects with several hosts and threads, switches and rollbacks.

    ``next_turn(project)`` returns the next turn of that project. A project's turns must be sent in the
    order they are made (one sender per project), so that the fold of the log is the fold the
    generator has in mind. Every turn id and body is unique, so a turn appearing twice is visible.
    """

    seed: int
    projects: Sequence[str]
    hosts: Sequence[str] = ("host-a", "host-b")
    threads: Sequence[str] = ("main", "side")
    rollback_every: int = 0  # 0: never; otherwise about one rollback per this many turns
    switch_every: int = 0  # 0: never switch source; otherwise about one switch per this many turns
    steady: frozenset[str] = frozenset()  # projects that never switch source and never roll back
    counter: int = 0
    _rng: random.Random = field(init=False)
    _source: dict[str, tuple[str, str]] = field(init=False, default_factory=dict)
    _length: dict[tuple[str, str, str], int] = field(init=False, default_factory=dict)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def next_turn(self, project: str, *, body_bytes: int = 0) -> TurnRecord:
        """The next turn of ``project`` (thread-safe)."""
        with self._lock:
            rng = self._rng
            self.counter += 1
            n = self.counter
            host, thread = self._source.get(project, (self.hosts[0], self.threads[0]))
            steady = project in self.steady
            if self.switch_every and not steady and rng.randrange(self.switch_every) == 0:
                host, thread = rng.choice(self.hosts), rng.choice(self.threads)
            self._source[project] = (host, thread)
            key = (project, host, thread)
            length = self._length.get(key, 0)
            seq: int | None = None
            if self.rollback_every and not steady and length >= 2 and rng.randrange(self.rollback_every) == 0:
                seq = rng.randint(max(1, length - 3), length)  # rewind: turns seq..length are superseded
                self._length[key] = seq
            else:
                self._length[key] = length + 1
                if rng.randrange(2) == 0:
                    seq = length + 1  # an explicit append (half the turns carry their seq)
            body = f"body {n} of {project} ✓ " + ("x" * max(0, body_bytes))
            return build_turn(
                project=project,
                host=host,
                thread=thread,
                turn_id=f"turn-{self.seed}-{n}",
                completed_at_micros=BASE_MICROS + n,
                body=body,
                seq=seq,
            )


# ------------------------------------------------------------------------------------------ the log


@dataclass
class RetryingSender:
    """Sends turns of ``projects`` one at a time with a library producer (``TurnProducer``: acks=all,
    idempotent); a failed turn is retried (the same turn) with a fresh producer until acknowledged, or
    until ``give_up_s`` has passed on one turn. Run it in a thread; set ``stop`` to end it."""

    bootstrap: str
    topic: str
    workload: Workload
    projects: tuple[str, ...]
    partitions: int
    pause: float = 0.02
    send_timeout_s: float = 10.0
    give_up_s: float = 300.0
    stop: threading.Event = field(default_factory=threading.Event)
    acked: list[tuple[str, int, int, float]] = field(default_factory=list)  # turn id, partition, offset, when
    failures: list[tuple[float, str, str]] = field(default_factory=list)  # when, code, message
    reconnects: int = 0
    error: BaseException | None = None

    def run(self) -> None:
        """Send until ``stop`` is set (an error that ends it is kept in ``error`` for the test)."""
        producer: TurnProducer | None = None
        try:
            i = 0
            while not self.stop.is_set():
                turn = self.workload.next_turn(self.projects[i % len(self.projects)])
                i += 1
                deadline = time.monotonic() + self.give_up_s
                while True:
                    try:
                        if producer is None:
                            producer = TurnProducer(
                                self.bootstrap,
                                self.topic,
                                partitions=self.partitions,
                                send_timeout=self.send_timeout_s,
                                connect_timeout=5.0,
                            )
                        where = producer.send(turn)
                        self.acked.append((turn.turn_id, where.partition, where.offset, time.monotonic()))
                        break
                    except ThroughlineError as exc:
                        assert exc.retriable or exc.code == "producer_closed", f"{exc.code}: {exc.message}"
                        self.failures.append((time.monotonic(), exc.code, exc.message[:120]))
                        if time.monotonic() > deadline:
                            raise
                        if producer is not None:  # start over: a new producer id, new connections
                            try:
                                producer.close(timeout=1.0)
                            except ThroughlineError:
                                pass
                            producer = None
                            self.reconnects += 1
                        self.stop.wait(0.5)
                self.stop.wait(self.pause)
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            if producer is not None:
                try:
                    producer.close(timeout=5.0)
                except ThroughlineError:
                    pass


@dataclass
class Fold:
    """A ``ChainBook`` fold of a log, with the records that did not decode."""

    book: ChainBook
    undecodable: int
    records: int
    by_turn_id: dict[str, list[tuple[int, int]]]  # turn id -> log positions holding it


def fold_log(stored: Iterable[Stored], partitions: int) -> Fold:
    """Fold records as the projector does (log order per partition; misplaced records are refused)."""
    book = ChainBook()
    undecodable = 0
    records = 0
    where: dict[str, list[tuple[int, int]]] = {}
    for s in stored:
        records += 1
        if s.value is None:
            undecodable += 1
            continue
        try:
            turn = decode_turn(s.value)
        except RecordDecodeError:
            undecodable += 1
            continue
        where.setdefault(turn.turn_id, []).append((s.partition, s.offset))
        if isinstance(turn.project_sha256, bytes) and len(turn.project_sha256) == 32:
            if partition_for(turn.project_sha256, partitions) != s.partition:
                book.quarantined.append((s.partition, s.offset, "misplaced"))
                continue
        book.apply(turn, s.partition, s.offset, partition_key=s.key)
    return Fold(book, undecodable, records, where)


def check_applied_prefix(
    bootstrap: str, topic: str, db: Path, partitions: int, *, missing_ok: bool = False
) -> dict[int, int]:
    """Assert that the projection file (its writer maybe just killed) equals the fold of exactly the log
    prefix its applied offsets name, partition by partition; return those offsets.

    ``missing_ok``: a file whose schema was never committed (a writer killed that early) applied
    nothing, and there is nothing to check (``{}``).
    """
    from throughline.projector.exceptions import ProjectionMissingError
    from throughline.projector.store import DuckProjection

    try:
        projection = DuckProjection.open(db, read_only=True, topic=topic)
    except ProjectionMissingError:
        if not missing_ok:
            raise
        return {}
    with projection:
        applied = projection.applied_offsets()
    stored, _ = read_topic_and_ends(bootstrap, topic)
    prefix = [s for s in stored if s.offset < applied.get(s.partition, 0)]
    check_projection(db, fold_log(prefix, partitions), {p: applied.get(p, 0) for p in range(partitions)}, topic=topic)
    return applied


def check_projection(db: Path | str, fold: Fold, ends: dict[int, int], *, topic: str) -> dict[str, int]:
    """Assert that the projection file equals the fold of the log; return what was compared.

    Checks, source by source: every live turn (seq, turn id, digests, log position), the chain head,
    the broken mark; project heads; counts of sources, turns, superseded turns and quarantined
    records; applied offsets equal to the log's end offsets; and that no (source, turn id) is live
    twice (a doubled turn).
    """
    from throughline.projector.store import DuckProjection

    book = fold.book
    projection = DuckProjection.open(db, read_only=True, topic=topic)
    try:
        stats = projection.stats()
        with projection.view() as view:
            for p, end in ends.items():
                assert view.applied_offset(p) == end, f"partition {p}: applied {view.applied_offset(p)} != end {end}"
            live_turns = 0
            for source, turns in book.live.items():
                info = view.source(source)
                assert info is not None, f"source {source.hex()[:12]} is missing from the projection"
                head = book.head_of(source)
                assert (info.length, info.chain_digest) == (head.length, head.chain_digest), (
                    f"source {source.hex()[:12]}: head {info.length} != fold {head.length}"
                )
                assert (info.broken_reason is not None) == (source in book.broken)
                rows = view.turns(source, 1, max(1, head.length))
                got = [(r.seq, r.turn_id, r.content_digest, r.chain_digest, r.partition, r.offset) for r in rows]
                want = [(t.seq, t.turn_id, t.content_digest, t.chain_digest, t.partition, t.offset) for t in turns]
                assert got == want, f"source {source.hex()[:12]}: live turns differ from the fold"
                ids = [r.turn_id for r in rows]
                assert len(ids) == len(set(ids)), f"source {source.hex()[:12]}: a turn is live twice"
                live_turns += len(rows)
            for project, source in book.heads.items():
                cursor = view.head(project)
                assert cursor is not None and cursor.source_sha256 == source, "a project head differs"
        assert stats.sources == len(book.live), f"sources {stats.sources} != fold {len(book.live)}"
        assert stats.turns == live_turns, f"live turns {stats.turns} != fold {live_turns}"
        assert stats.superseded == len(book.superseded), f"superseded {stats.superseded} != {len(book.superseded)}"
        quarantined = len(book.quarantined) + fold.undecodable
        assert stats.quarantined == quarantined, f"quarantined {stats.quarantined} != fold {quarantined}"
        assert stats.projects == len(book.heads)
        return {"sources": stats.sources, "live_turns": live_turns, "records": fold.records}
    finally:
        projection.close()


# ------------------------------------------------------------------------------------------ processes


class Child:
    """One ``throughline`` subprocess (restartable); stdout and stderr go to files in ``folder``."""

    def __init__(
        self, name: str, argv: Sequence[str], folder: Path, env: dict[str, str], *, preexec: Any = None
    ) -> None:
        self.name = name
        self.preexec = preexec  # run in the child before exec (a resource limit)
        self.argv = [sys.executable, "-m", "throughline.cli", *argv]
        self.folder = folder
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.starts = 0
        self.kills = 0
        self.exits: list[int] = []  # exit codes of runs that ended on their own or by SIGTERM

    @property
    def stdout_path(self) -> Path:
        return self.folder / f"{self.name}.{self.starts}.out"

    @property
    def stderr_path(self) -> Path:
        return self.folder / f"{self.name}.{self.starts}.err"

    def start(self) -> Child:
        """Start a new run (the previous one must have ended)."""
        assert self.proc is None or self.proc.poll() is not None
        self.starts += 1
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            # Its own session, so that a kill takes its children (an audit command) with it.
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=self.env,
                cwd=self.folder,
                start_new_session=True,
                preexec_fn=self.preexec,
            )
        self.started_at = time.monotonic()
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def sigkill(self) -> bool:
        """SIGKILL the running process and its children (``False`` when it had already ended)."""
        if not self.alive():
            self._reap()
            return False
        self._kill_group()
        self.kills += 1
        return True

    def _kill_group(self) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait (bounded); the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self._exit_code(timeout, "did not stop on SIGTERM")

    def wait(self, timeout: float) -> int:
        """Wait (bounded) for the run to end on its own; the exit code."""
        return self._exit_code(timeout, f"did not finish in {timeout}s")

    def _exit_code(self, timeout: float, failure: str) -> int:
        # A run that outlives the bound is killed (nothing is left running) and fails the test.
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
            raise AssertionError(f"{self.name} {failure}; stderr:\n{self.stderr()}") from None
        self.exits.append(code)
        return code

    def _reap(self) -> None:
        if self.proc is not None and self.proc.returncode is not None and len(self.exits) < self.starts:
            self.exits.append(self.proc.returncode)

    def stderr(self, limit: int = 4000) -> str:
        try:
            return self.stderr_path.read_text(encoding="utf-8", errors="replace")[-limit:]
        except OSError:
            return ""

    def stdout(self) -> str:
        try:
            return self.stdout_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def stop_quietly(self) -> None:
        """Kill without counting (cleanup)."""
        if self.alive():
            self._kill_group()


def last_error(text: str) -> dict[str, str] | None:
    """The last ``{"error": {...}}`` document in a stderr text."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith('{"error"'):
            try:
                return dict(json.loads(line)["error"])
            except (ValueError, KeyError, TypeError):
                return None
    return None


def status_json(folder: Path, env: dict[str, str], db: Path | str) -> tuple[int, dict[str, Any] | None]:
    """``throughline status --json --db DB``: (exit code, the document or None)."""
    done = subprocess.run(
        [sys.executable, "-m", "throughline.cli", "status", "--json", "--db", str(db)],
        capture_output=True,
        text=True,
        env=env,
        cwd=folder,
        timeout=120,
        check=False,
    )
    try:
        return done.returncode, dict(json.loads(done.stdout))
    except ValueError:
        return done.returncode, None


def readyz_lag(url: str, *, timeout: float = 30.0) -> int | None:
    """The ``lag`` ``serve``'s ``/readyz`` at ``url`` reports (``None`` when it does not answer or says none)."""
    try:
        _, doc = http_json(url + "/readyz", timeout=timeout)
    except OSError:
        return None
    return doc.get("lag") if isinstance(doc, dict) else None


def http_json(url: str, *, timeout: float = 30.0, data: bytes | None = None) -> tuple[int, Any]:
    """GET (or POST ``data``) ``url``; (status, parsed JSON or text). Connection errors raise OSError."""
    headers = {"Accept": "application/json"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        with exc:
            body = exc.read()
            status = exc.code
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode("utf-8", "replace")


def project_partition(project: str, partitions: int) -> int:
    """The partition of a project."""
    return partition_for(project_sha256(project), partitions)


def wait_until(predicate: Any, *, timeout: float, interval: float = 0.1, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy (bounded); that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
