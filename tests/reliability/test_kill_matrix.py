"""Kill matrix (docs/reliability.md#1-kill-matrix): SIGKILL the projector, ``serve`` and the Observer at random moments.

One real broker; turns are produced steadily (several projects, hosts and threads, thread switches
and rollbacks) while three ``throughline`` processes run and HTTP readers read through ``serve``:

- ``throughline project`` on its own DuckDB file;
- ``throughline serve`` (projector + HTTP API) on another DuckDB file, on a fixed loopback port;
- ``throughline observe --follow --url`` (the reference Observer) auditing one project through
  ``serve``; its audit command appends each audited turn to a file.

A seeded schedule (the seed is printed; ``THROUGHLINE_KILL_SEED`` replays it) SIGKILLs one of the
three, each at a random moment after its own (re)start (during start-up, during a batch, during a
read or an audit), and restarts it at once. ``THROUGHLINE_KILLS`` sets the number of kills.

After every kill of a process that writes a projection, its file is opened read-only and must equal
a ``ChainBook`` fold of exactly the log prefix its applied offsets name (rows and offsets commit
together). After every kill of the Observer its state file must still load. At the end, with ingest
stopped and everything caught up:

- every acknowledged turn is in the log where the broker said, and no turn id is in the log twice;
- both projection files equal the fold of the whole log (no turn lost or doubled), and each other;
- the Observer's saved cursor is the project's head, every audited turn is the turn the log holds at
  that seq, the audited seqs are exactly 1..head with no gap, and after every kill the Observer
  resumed exactly after its saved cursor (nothing it had committed was audited again).
"""

from __future__ import annotations

import json
import os
import random
import shlex
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import rel_support
from rel_support import Child, Workload, check_applied_prefix, check_projection, fold_log, wait_until
from support.topic import Stored, read_topic_and_ends

from throughline.core.cursor import Cursor, decode_cursor
from throughline.core.identity import project_sha256
from throughline.log import ensure_topic
from throughline.producers.producer import TurnProducer
from throughline.projector.store import DuckProjection
from throughline.reader import ObserverRead, load_observer_state
from throughline.serve.client import HttpReader
from throughline.serve.exceptions import ServerUnavailableError
from throughline.testing.kafka import free_port

pytestmark = pytest.mark.integration

KILLS = rel_support.env_int("THROUGHLINE_KILLS", 15)
PARTITIONS = 3
KEY_HEX = "6b" * 32
OBSERVED = "/srv/kill-matrix/observed"
OTHERS = ("/srv/kill-matrix/alpha", "/srv/kill-matrix/beta", "/srv/kill-matrix/gamma")
CATCH_UP_TIMEOUT = 180.0


@dataclass
class Ingest:
    """Produces turns steadily on a thread; remembers every acknowledged (turn, position)."""

    bootstrap: str
    topic: str
    workload: Workload
    batch_pause: float = 0.05
    partitions: int = PARTITIONS
    stop: threading.Event = field(default_factory=threading.Event)
    acked: list[tuple[str, int, int]] = field(default_factory=list)  # (turn id, partition, offset)
    error: BaseException | None = None

    def run(self) -> None:
        try:
            with TurnProducer(self.bootstrap, self.topic, partitions=self.partitions, send_timeout=60.0) as producer:
                while not self.stop.is_set():
                    turns = [self.workload.next_turn(p) for p in (OBSERVED, *OTHERS, *OTHERS)]
                    for turn, where in zip(turns, producer.send_many(turns), strict=True):
                        self.acked.append((turn.turn_id, where.partition, where.offset))
                    self.stop.wait(self.batch_pause)
        except BaseException as exc:  # reported by the test
            self.error = exc


@dataclass
class Readers:
    """HTTP readers: series of the other projects through ``serve``, across its restarts."""

    url: str
    stop: threading.Event = field(default_factory=threading.Event)
    counts: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bump(self, key: str) -> None:
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1

    def run(self, seed: int) -> None:
        rng = random.Random(seed)
        reader = HttpReader(self.url, timeout=15.0)
        after: dict[str, str | None] = dict.fromkeys(OTHERS)
        while not self.stop.is_set():
            project = rng.choice(OTHERS)
            try:
                page = reader.read_observer_turn_page(project=project, after_cursor=after[project], limit=4)
                pages = [page]
                for _ in range(1000):
                    if not page.ok or page.page.complete:
                        break
                    page = reader.read_observer_turn_page(
                        project=project,
                        after_cursor=after[project],
                        through_cursor=page.throughCursor,
                        page_token=page.page.nextToken,
                        limit=4,
                    )
                    pages.append(page)
                self.bump(page.status)
                if page.status == "resync_required":
                    after[project] = None  # a rollback under the after cursor: start over with a snapshot
                elif page.ok and page.page.complete:
                    after[project] = page.throughCursor
                    self._check_series(pages)
            except ServerUnavailableError:
                self.bump("unavailable")  # serve was being killed or restarted
                self.stop.wait(0.2)
            except Exception as exc:  # a typed error or anything else: both are failures here
                self.failed(exc)
                self.stop.wait(0.2)

    def failed(self, exc: Exception) -> None:
        """A read that failed other than by an unreachable serve."""
        self.failures.append(f"{type(exc).__name__}: {exc}")

    def _check_series(self, pages: list[ObserverRead]) -> None:
        seqs = [t.seq for p in pages for t in p.turns]
        assert seqs == sorted(set(seqs)), seqs
        if seqs and not pages[0].historyTruncated:
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))


def _applied_prefix_check(bootstrap: str, topic: str, db: Path) -> int:
    """The projection file (its writer just killed) equals the fold of exactly its applied log prefix."""
    return sum(check_applied_prefix(bootstrap, topic, db, PARTITIONS, missing_ok=True).values())


def _audit_lines(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Complete audit lines, and how many partial lines a kill cut."""
    if not path.exists():
        return [], 0
    lines, partial = [], 0
    for raw in path.read_text(encoding="utf-8").splitlines():
        if not raw.strip():
            continue
        try:
            lines.append(json.loads(raw))
        except ValueError:
            partial += 1
    return lines, partial


def _saved_length(state: Path) -> int | None:
    cursor = load_observer_state(state)  # must load after any kill: the save is atomic
    if cursor is None:
        return None
    decoded = decode_cursor(cursor)
    assert isinstance(decoded, Cursor)
    return decoded.length


def test_kill_matrix(kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path) -> None:
    seed = rel_support.env_int("THROUGHLINE_KILL_SEED", int.from_bytes(os.urandom(4), "big"))
    print(f"\nkill matrix: seed {seed} (replay with THROUGHLINE_KILL_SEED={seed}), {KILLS} kills")
    rng = random.Random(seed)
    topic = kafka_topic_name
    ensure_topic(kafka_bootstrap, topic, partitions=PARTITIONS)
    db_proj, db_serve = tmp_path / "projector.duckdb", tmp_path / "serve.duckdb"
    state, audit = tmp_path / "observer.state", tmp_path / "audit.jsonl"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = rel_support.child_env(
        THROUGHLINE_BOOTSTRAP_SERVERS=kafka_bootstrap, THROUGHLINE_TOPIC=topic, THROUGHLINE_TOKEN_KEY=KEY_HEX
    )
    audit_cmd = f"cat >> {shlex.quote(str(audit))}; echo >> {shlex.quote(str(audit))}"
    children = {
        "projector": Child("projector", ["project", "--db", str(db_proj)], tmp_path, env),
        "serve": Child(
            "serve",
            ["serve", "--host", "127.0.0.1", "--port", str(port), "--db", str(db_serve), "--read-wait", "2"],
            tmp_path,
            env,
        ),
        "observer": Child(
            "observer",
            [
                "observe",
                "--follow",
                "--url",
                url,
                "--project",
                OBSERVED,
                "--state",
                str(state),
                "--exec",
                audit_cmd,
                "--limit",
                "3",
                "--interval",
                "0.1",
                "--max-pending-wait",
                "600",
            ],
            tmp_path,
            env,
        ),
    }
    # The observed project never switches or rolls back, so its chain is exactly its audit trail.
    workload = Workload(seed, (OBSERVED, *OTHERS), switch_every=6, rollback_every=8, steady=frozenset({OBSERVED}))
    ingest = Ingest(kafka_bootstrap, topic, workload)
    readers = Readers(url)
    threads: list[threading.Thread] = []
    markers: list[tuple[int, int | None]] = []  # (audit lines at an Observer (re)start, saved length)
    prefix_checks = 0
    try:
        # The Observer's first contact: two turns, a snapshot of both, and a saved cursor.
        with TurnProducer(kafka_bootstrap, topic, partitions=PARTITIONS) as producer:
            producer.send_many([workload.next_turn(OBSERVED) for _ in range(2)])
        children["projector"].start()
        children["serve"].start()
        wait_until(lambda: _ready(url), timeout=120, what="serve to answer /readyz")
        markers.append((0, None))
        children["observer"].start()
        wait_until(lambda: state.exists() and _saved_length(state) == 2, timeout=120, what="the first saved cursor")
        threads = [threading.Thread(target=ingest.run, name="ingest", daemon=True)]
        threads += [
            threading.Thread(target=readers.run, args=(seed + i,), name=f"reader-{i}", daemon=True) for i in range(2)
        ]
        for t in threads:
            t.start()

        order = (["projector", "serve", "observer"] * (KILLS // 3 + 1))[:KILLS]
        rng.shuffle(order)
        for target in order:
            child = children[target]
            due = child.started_at + rng.uniform(0.2, 3.0)
            time.sleep(max(0.0, due - time.monotonic()))
            assert child.alive(), (
                f"{target} ended on its own (exit {child.proc.poll() if child.proc else None}):\n{child.stderr()}"
            )
            assert ingest.error is None, ingest.error
            assert child.sigkill()
            if target == "projector":
                _applied_prefix_check(kafka_bootstrap, topic, db_proj)
                prefix_checks += 1
            elif target == "serve":
                _applied_prefix_check(kafka_bootstrap, topic, db_serve)
                prefix_checks += 1
            else:
                if audit.exists() and not audit.read_bytes().endswith(b"\n"):
                    with open(audit, "ab") as f:  # end a line the kill cut, so the next audit starts its own
                        f.write(b"\n")
                lines, _ = _audit_lines(audit)
                markers.append((len(lines), _saved_length(state)))
            child.start()

        # Stop producing; let everything catch up; stop gracefully.
        stored, ends, fold, head = stop_and_fold(ingest, threads[0], kafka_bootstrap, topic, PARTITIONS)
        wait_until(
            lambda: rel_support.readyz_lag(url, timeout=10) == 0,
            timeout=CATCH_UP_TIMEOUT,
            what="serve to apply the whole log",
        )
        wait_until(
            lambda: _saved_length(state) == head, timeout=CATCH_UP_TIMEOUT, what="the Observer to reach the head"
        )
        readers.stop.set()
        for t in threads[1:]:
            t.join(timeout=60)
        for name in ("observer", "serve", "projector"):
            code = children[name].terminate()
            assert code == 0, f"{name} exited {code} on SIGTERM:\n{children[name].stderr()}"
        final = Child("catch-up", ["project", "--db", str(db_proj), "--until-caught-up"], tmp_path, env).start()
        assert final.wait(CATCH_UP_TIMEOUT) == 0, final.stderr()

        # The log: every acknowledged turn where the broker said, no turn twice.
        positions = {(p, o): tid for tid, p, o in ingest.acked}
        by_position = {(s.partition, s.offset): s for s in stored}
        lost = [pos for pos in positions if pos not in by_position]
        assert not lost, f"{len(lost)} acknowledged records are not in the log"
        doubled_in_log = {tid: where for tid, where in fold.by_turn_id.items() if len(where) > 1}
        assert not doubled_in_log, f"turns in the log twice: {list(doubled_in_log)[:5]}"
        # Both projections equal the fold of the whole log, and each other.
        compared = check_projection(db_proj, fold, ends, topic=topic)
        check_projection(db_serve, fold, ends, topic=topic)
        with DuckProjection.open(db_proj, read_only=True) as a, DuckProjection.open(db_serve, read_only=True) as b:
            assert a.table_digests() == b.table_digests()
        # The Observer.
        audited, reaudited, partial = _check_audit(audit, markers, fold, head)
    finally:
        ingest.stop.set()
        readers.stop.set()
        for child in children.values():
            child.stop_quietly()

    kills = {name: c.kills for name, c in children.items()}
    print(
        f"kill matrix: kills {kills}, records {len(stored)}, acknowledged {len(ingest.acked)}, reads {readers.counts}, "
        f"audited {audited} (re-audited after a kill: {reaudited}, cut lines: {partial})"
    )
    for name, c in children.items():
        rel_support.record("kill", name, kills=c.kills, restarts=c.starts - 1)
    rel_support.record(
        "kill",
        "invariants",
        seed=seed,
        records=len(stored),
        acknowledged=len(ingest.acked),
        lost=0,
        doubled=0,
        unhandled=len(readers.failures),
        prefix_checks=prefix_checks,
        live_turns=compared["live_turns"],
        audited_turns=audited,
        audit_gaps=0,
        audit_duplicates=0,
        reaudited_after_kill=reaudited,
        http_reads=sum(readers.counts.values()),
        http_unavailable=readers.counts.get("unavailable", 0),
        http_errors=len(readers.failures),
    )
    # Recorded first (the log and projection invariants above all held); an HTTP read that failed in a
    # way the Observer cannot retry (a serve killed mid-answer, see test_an_answer_cut_...) fails here.
    assert not readers.failures, readers.failures[:5]


def stop_and_fold(
    ingest: Ingest, producing: threading.Thread, bootstrap: str, topic: str, partitions: int
) -> tuple[list[Stored], dict[int, int], rel_support.Fold, int]:
    """Stop the ingest and fold the log it left: (records, end offsets, fold, OBSERVED's chain length)."""
    ingest.stop.set()
    producing.join(timeout=120)
    assert ingest.error is None, ingest.error
    stored, ends = read_topic_and_ends(bootstrap, topic)
    fold = fold_log(stored, partitions)
    return stored, ends, fold, len(fold.book.live[_source_of(fold, OBSERVED)])


def _source_of(fold: rel_support.Fold, project: str) -> bytes:
    return fold.book.heads[project_sha256(project)]


def _ready(url: str) -> bool:
    try:
        status, _ = rel_support.http_json(url + "/readyz", timeout=10)
    except OSError:
        return False
    return status in (200, 503)


def _check_audit(
    audit: Path, markers: list[tuple[int, int | None]], fold: rel_support.Fold, head: int
) -> tuple[int, int, int]:
    """The audit trail: true turns, 1..head with no gap, and every run resumed after its saved cursor."""
    lines, partial = _audit_lines(audit)
    chain = fold.book.live[_source_of(fold, OBSERVED)]
    for line in lines:
        turn = chain[line["seq"] - 1]
        assert (line["contentDigest"], line["chainDigest"]) == (turn.content_digest.hex(), turn.chain_digest.hex())
        assert line["body"] == turn.record.body
    bounds = [m[0] for m in markers[1:]] + [len(lines)]
    reaudited = 0
    for (start, saved), end in zip(markers, bounds, strict=True):
        run = [line["seq"] for line in lines[start:end]]
        expected_first = 1 if saved is None else saved + 1
        assert run == list(range(expected_first, expected_first + len(run))), (
            f"an Observer run that started after saved length {saved} audited {run[:10]}..."
        )
        reaudited += sum(1 for seq in run if seq <= max((line["seq"] for line in lines[:start]), default=0))
    assert {line["seq"] for line in lines} == set(range(1, head + 1)), "the audited set has a gap"
    return len({line["seq"] for line in lines}), reaudited, partial


# ------------------------------------------------------------------------------------------ a serve dying mid-answer

_CUT_ANSWERS = {
    "status line cut": b"HTTP/1.1 2",
    "body cut": b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n{"schema": "thr',
}


@pytest.mark.parametrize("name", sorted(_CUT_ANSWERS))
def test_an_answer_cut_by_a_dying_serve_is_retriable(name: str) -> None:
    # A serve SIGKILLed while it writes an answer leaves the client a cut answer. The Observer backs off
    # from retriable errors only, so the client must raise ServerUnavailableError (retriable), not an
    # http.client exception (which kills the Observer) or a non-retriable BadResponseError.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]

        def answer_and_die() -> None:
            conn, _ = listener.accept()
            with conn:
                _read_request(conn)  # all of it: closing on unread data would reset the connection instead
                conn.sendall(_CUT_ANSWERS[name])
                conn.shutdown(socket.SHUT_WR)

        thread = threading.Thread(target=answer_and_die, daemon=True)
        thread.start()
        with pytest.raises(ServerUnavailableError) as raised:
            HttpReader(f"http://127.0.0.1:{port}", timeout=10).read_observer_turn_page(project="/p")
        thread.join(timeout=10)
    assert raised.value.retriable


def _read_request(conn: socket.socket) -> None:
    """Read one HTTP request (headers and the body its Content-Length announces)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        body += chunk
