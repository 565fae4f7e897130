"""Broker faults (docs/reliability.md#2-broker-faults): stop and restart the real broker under running producers.

A private broker (the harness's ``kafka_broker_factory``: same data directory, ports and cluster id
across restarts) carries the topic while these run:

- two library producers (``TurnProducer``, one per group of projects, one turn at a time) that retry
  a refused or timed-out turn (same turn id) until the broker acknowledges it, and report each retry;
- ``throughline ingest --follow`` on a file the test keeps appending to (with its resume state; a run
  that fails on the broker is restarted, as a supervisor would);
- ``throughline project`` and ``throughline serve``.

The broker is stopped (SIGTERM) or crashed (SIGKILL), alternately, ``THROUGHLINE_BROKER_FAULTS`` times
(1 in CI: a stop; the recorded run does more), each time for ``THROUGHLINE_BROKER_OUTAGE`` seconds, then
started again on the same data. Meanwhile ``/healthz`` and ``/readyz`` of ``serve`` are polled: the
service stays alive (``/healthz`` 200), the outage is visible (``/readyz`` not ready, ``logError``
``broker_unavailable``), and it is ready again afterwards (the delay is recorded). Afterwards:

- the projector and ``serve`` recovered by themselves: still the same processes, caught up;
- every turn a producer saw acknowledged is in the log at that position and in both projections;
  every ingested line is in the projections; nothing is doubled (a retried turn that was in fact
  written twice is in the log twice and applied once);
- both projection files equal a ``ChainBook`` fold of the log.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import rel_support
from rel_support import Child, RetryingSender, Workload, check_projection, fold_log, wait_until
from support.topic import read_topic_and_ends

from throughline.log import ensure_topic
from throughline.projector.store import DuckProjection
from throughline.testing.kafka import free_port

pytestmark = pytest.mark.integration

FAULTS = rel_support.env_int("THROUGHLINE_BROKER_FAULTS", 1)
#: Longer than the clients' request timeouts (15 s), so that nothing can simply wait the outage out.
OUTAGE_S = rel_support.env_float("THROUGHLINE_BROKER_OUTAGE", 20.0)
PARTITIONS = 3
KEY_HEX = "7c" * 32
LIBRARY_PROJECTS = (("/srv/broker/a", "/srv/broker/b"), ("/srv/broker/c", "/srv/broker/d"))
INGEST_PROJECTS = ("/srv/broker/ingest-1", "/srv/broker/ingest-2")
CATCH_UP_TIMEOUT = 240.0


@dataclass
class Probe:
    """Polls serve's /healthz and /readyz; remembers what they said."""

    url: str
    stop: threading.Event = field(default_factory=threading.Event)
    seen: list[tuple[float, str, int, Any]] = field(default_factory=list)

    def run(self) -> None:
        while not self.stop.is_set():
            for path in ("/healthz", "/readyz"):
                try:
                    status, doc = rel_support.http_json(self.url + path, timeout=30)
                except OSError as exc:
                    status, doc = -1, str(exc)
                self.seen.append((time.monotonic(), path, status, doc))
            self.stop.wait(0.5)


def test_broker_restarts_lose_nothing(kafka_broker_factory: Any, kafka_topic_name: str, tmp_path: Path) -> None:
    broker = kafka_broker_factory()
    bootstrap = broker.bootstrap_servers
    topic = kafka_topic_name
    ensure_topic(bootstrap, topic, partitions=PARTITIONS)
    env = rel_support.child_env(
        THROUGHLINE_BOOTSTRAP_SERVERS=bootstrap, THROUGHLINE_TOPIC=topic, THROUGHLINE_TOKEN_KEY=KEY_HEX
    )
    db_proj, db_serve = tmp_path / "projector.duckdb", tmp_path / "serve.duckdb"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    projector = Child("projector", ["project", "--db", str(db_proj)], tmp_path, env)
    serve = Child("serve", ["serve", "--port", str(port), "--db", str(db_serve)], tmp_path, env)
    turns_file = tmp_path / "turns.jsonl"
    turns_file.touch()
    ingest_argv = [
        "ingest",
        str(turns_file),
        "--follow",
        "--partitions",
        str(PARTITIONS),
        "--send-timeout",
        "10",
        "--connect-timeout",
        "5",
        "--poll-interval",
        "0.1",
    ]
    ingest = Child("ingest", ingest_argv, tmp_path, env)
    workload = Workload(
        7, tuple(p for group in LIBRARY_PROJECTS for p in group) + INGEST_PROJECTS, switch_every=5, rollback_every=9
    )
    producers = [RetryingSender(bootstrap, topic, workload, group, PARTITIONS) for group in LIBRARY_PROJECTS]
    probe = Probe(url)
    stop_lines = threading.Event()
    lines_written: list[str] = []
    ingest_exits: list[dict[str, str] | None] = []
    stop_supervisor = threading.Event()

    def supervise_ingest() -> None:
        # As an operator's supervisor would: an ingest run that gave up on the broker is restarted
        # (its state file makes the new run resume right after the last acknowledged line).
        while not stop_supervisor.is_set():
            if not ingest.alive():
                ingest.wait(5)
                ingest_exits.append(rel_support.last_error(ingest.stderr()))
                ingest.start()
            stop_supervisor.wait(0.2)

    def write_lines() -> None:
        i = 0
        while not stop_lines.is_set():
            turn = workload.next_turn(INGEST_PROJECTS[i % 2])
            i += 1
            doc = {
                "project": turn.project,
                "host": turn.host,
                "thread": turn.thread,
                "turnId": turn.turn_id,
                "completedAt": "2026-03-01T00:00:00Z",
                "body": turn.body,
            }
            if turn.seq is not None:
                doc["seq"] = turn.seq
            with open(turns_file, "a", encoding="utf-8") as f:
                f.write(json.dumps(doc, ensure_ascii=False) + "\n")
            lines_written.append(turn.turn_id)
            stop_lines.wait(0.03)

    threads = [threading.Thread(target=p.run, daemon=True) for p in producers]
    threads.append(threading.Thread(target=write_lines, daemon=True))
    threads.append(threading.Thread(target=probe.run, daemon=True))
    supervisor = threading.Thread(target=supervise_ingest, daemon=True)
    outages: list[tuple[float, float]] = []
    t0 = time.monotonic()

    def mark(what: str) -> None:
        print(f"  +{time.monotonic() - t0:5.1f}s {what}", flush=True)

    try:
        projector.start()
        serve.start()
        ingest.start()
        wait_until(lambda: _status(url, "/readyz") == 200, timeout=120, what="serve to be ready")
        mark("serve ready")
        for t in threads:
            t.start()
        supervisor.start()
        recovery: list[float] = []
        for fault in range(FAULTS):
            time.sleep(4.0)  # steady traffic before each fault
            began = time.monotonic()
            if fault % 2 == 0:
                broker.stop(keep_data=True)  # graceful
            else:
                broker.kill()  # a crash: SIGKILL, same data directory
            time.sleep(OUTAGE_S)
            mark(f"broker down ({'stopped' if fault % 2 == 0 else 'killed'})")
            broker.start()
            back = time.monotonic()
            outages.append((began, back))
            mark("broker up again")
            for child in (projector, serve):
                assert child.alive(), f"{child.name} did not survive the broker outage:\n{child.stderr()}"
            # Recovered by itself: ready again (it has caught up with what was produced meanwhile).
            try:
                wait_until(
                    lambda: _status(url, "/readyz") == 200,
                    timeout=CATCH_UP_TIMEOUT,
                    interval=0.5,
                    what="serve to be ready after the outage",
                )
            except AssertionError:
                raise AssertionError(f"serve did not become ready again: {_readyz_trail(probe, t0)}") from None
            recovery.append(round(time.monotonic() - back, 1))
            mark("serve ready again")
        time.sleep(4.0)
        for p in producers:
            p.stop.set()
        stop_lines.set()
        for t in threads[:-1]:
            t.join(timeout=120)
        for p in producers:
            assert p.error is None, p.error
        for child in (projector, serve):
            assert child.alive(), f"{child.name} did not survive the broker outages:\n{child.stderr()}"
        mark("producers stopped")
        wait_until(
            lambda: _ingested(bootstrap, topic, lines_written),
            timeout=CATCH_UP_TIMEOUT,
            what="ingest to send every line",
            interval=1.0,
        )
        mark("every line ingested")
        stop_supervisor.set()
        supervisor.join(timeout=30)
        assert ingest.terminate() == 0, ingest.stderr()
        mark("ingest stopped")
        stored, ends = read_topic_and_ends(bootstrap, topic)
        wait_until(
            lambda: rel_support.readyz_lag(url) == 0,
            timeout=CATCH_UP_TIMEOUT,
            what="serve to catch up after the outages",
        )
        mark("serve caught up")
        wait_until(
            lambda: _status(url, "/readyz") == 200, timeout=CATCH_UP_TIMEOUT, what="serve to be ready at the end"
        )
        assert _status(url, "/healthz") == 200
        probe.stop.set()
        threads[-1].join(timeout=60)
        assert serve.terminate() == 0, serve.stderr()
        mark("serve stopped")
        assert projector.terminate() == 0, projector.stderr()
        mark("projector stopped")
        final = Child("catch-up", ["project", "--db", str(db_proj), "--until-caught-up"], tmp_path, env).start()
        assert final.wait(CATCH_UP_TIMEOUT) == 0, final.stderr()
        mark("all stopped")

        fold = fold_log(stored, PARTITIONS)
        by_position = {(s.partition, s.offset) for s in stored}
        acked = [a for p in producers for a in p.acked]
        lost = [a for a in acked if (a[1], a[2]) not in by_position]
        assert not lost, f"{len(lost)} acknowledged turns are not in the log: {lost[:3]}"
        missing_lines = [tid for tid in lines_written if tid not in fold.by_turn_id]
        assert not missing_lines, f"{len(missing_lines)} ingested lines are not in the log"
        in_log_twice = sum(1 for where in fold.by_turn_id.values() if len(where) > 1)
        compared = check_projection(db_proj, fold, ends, topic=topic)
        code, status = rel_support.status_json(tmp_path, env, db_proj)
        assert code == 0 and status is not None and status["lag"] == 0, (code, status)
        assert status["counts"]["turns"] == compared["live_turns"]
        check_projection(db_serve, fold, ends, topic=topic)
        with DuckProjection.open(db_proj, read_only=True) as a, DuckProjection.open(db_serve, read_only=True) as b:
            assert a.table_digests() == b.table_digests()
            duplicates = sum(s.duplicates for s in a.stats().partitions)
        assert duplicates >= in_log_twice  # every turn the log holds twice was applied once
    finally:
        for p in producers:
            p.stop.set()
        stop_lines.set()
        probe.stop.set()
        stop_supervisor.set()
        for child in (projector, serve, ingest):
            child.stop_quietly()

    # What health said meanwhile: the outage was visible, and the service was ready again after it.
    during = [
        doc for (t, path, status, doc) in probe.seen if path == "/readyz" and any(b + 1.0 <= t <= e for b, e in outages)
    ]
    unready = [d for d in during if isinstance(d, dict) and d.get("status") == "not_ready"]
    assert unready, "/readyz never reported the outage"
    assert any((d.get("logError") or {}).get("code") == "broker_unavailable" for d in unready), unready[:2]
    # The service stayed alive through every outage (liveness).
    alive = [
        status for (t, path, status, _) in probe.seen if path == "/healthz" and any(b <= t <= e for b, e in outages)
    ]
    assert alive and all(s == 200 for s in alive), alive
    retries = sum(len(p.failures) for p in producers)
    ingest_restarts = len(ingest_exits)
    # An ingest run that gave up said why, with the broker's stable code.
    assert all(e is not None and e["code"] == "broker_unavailable" for e in ingest_exits), ingest_exits
    print(
        f"\nbroker faults: {FAULTS} outages of {OUTAGE_S:g}s; acknowledged {len(acked)} + {len(lines_written)} lines; "
        f"producer retries {retries} (reconnects {sum(p.reconnects for p in producers)}); ingest restarts "
        f"{ingest_restarts}; turns in the log twice (applied once) {in_log_twice}; ready again after {recovery} s"
    )
    rel_support.record(
        "broker",
        "restarts",
        faults=FAULTS,
        outage_seconds=OUTAGE_S,
        acknowledged=len(acked),
        ingested_lines=len(lines_written),
        producer_retries=retries,
        ingest_restarts=ingest_restarts,
        log_duplicates_applied_once=in_log_twice,
        lost=0,
        doubled=0,
        unhandled=0,
        projector_restarts=0,
        serve_restarts=0,
        live_turns=compared["live_turns"],
        readyz_unready_during_outage=len(unready),
        ready_again_after_seconds=recovery,
    )


def _readyz_trail(probe: Probe, t0: float) -> list[tuple[float, int, Any]]:
    out = []
    for t, path, status, doc in probe.seen[-40:]:
        if path == "/readyz" and isinstance(doc, dict):
            out.append(
                (round(t - t0, 1), status, {k: doc.get(k) for k in ("projector", "lag", "logError", "projectorError")})
            )
    return out


def _status(url: str, path: str) -> int:
    try:
        status, _ = rel_support.http_json(url + path, timeout=30)
    except OSError:
        return -1
    return status


def _ingested(bootstrap: str, topic: str, turn_ids: list[str]) -> bool:
    """Whether every line written so far is in the log."""
    stored, _ = read_topic_and_ends(bootstrap, topic)
    return set(turn_ids) <= set(fold_log(stored, PARTITIONS).by_turn_id)
