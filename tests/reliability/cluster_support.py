"""A world on the three-node cluster for ``test_cluster_faults.py`` (not a test module).

``ClusterWorld`` creates a topic with three replicas and ``min.insync.replicas=2`` (explicitly, through
the admin client), and runs on it:

- ``RetryingSender`` threads (rel_support): library producers (``TurnProducer``, ``acks=all``, idempotent) sending one turn
  at a time and retrying a failed turn (the same turn) with a fresh producer until it is acknowledged;
  each acknowledgement is remembered with its position and time;
- ``throughline serve`` projecting the topic into its DuckDB file;
- ``throughline observe --follow`` auditing one project through ``serve`` (its audit command appends
  each audited turn to a file).

``finish`` stops the senders, lets ``serve`` and the Observer catch up, stops both with SIGTERM (``serve``
must exit within ``SHUTDOWN_BOUND_S``), and checks: every acknowledged turn is in the log at the
position the broker gave; the projection equals a ``ChainBook`` fold of the whole log (no turn lost,
none live twice); the audit trail is exactly the observed project's chain, each turn once, in order.
"""

from __future__ import annotations

import json
import shlex
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import rel_support
from rel_support import Child, RetryingSender, Workload, check_projection, fold_log, wait_until
from support.topic import read_topic_and_ends

from throughline.core.identity import project_sha256
from throughline.log.topic import ensure_topic
from throughline.producers.producer import TurnProducer
from throughline.reader import load_observer_state
from throughline.testing.kafka import free_port
from throughline.testing.kafka.cluster import KafkaCluster

PARTITIONS = 3
KEY_HEX = "5d" * 32
OBSERVED = "/srv/cluster/observed"
OTHERS = ("/srv/cluster/alpha", "/srv/cluster/beta", "/srv/cluster/gamma")
#: What the topic is created with: three replicas, two of them in sync for an acknowledgement, and the
#: retention throughline requires (the log keeps every record).
#: What throughline creates the topic with on this cluster (checked on the created topic).
TOPIC_CONFIGS = {
    "min.insync.replicas": "2",
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "cleanup.policy": "delete",
}
#: How long ``serve`` may take to exit after SIGTERM (docs/reliability.md, "Cluster faults").
SHUTDOWN_BOUND_S = 25.0
SEND_TIMEOUT_S = 10.0
CATCH_UP_TIMEOUT = 180.0


@dataclass
class ClusterWorld:
    """Senders, ``serve`` and the Observer on a fresh topic of the cluster (see the module docstring)."""

    cluster: KafkaCluster
    topic: str
    folder: Path
    seed: int = 11
    senders: list[RetryingSender] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    serve: Child | None = None
    observer: Child | None = None
    url: str = ""
    shutdown_s: float | None = None
    initial: list[tuple[str, int, int, float]] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap_servers

    @property
    def db(self) -> Path:
        return self.folder / "serve.duckdb"

    @property
    def audit(self) -> Path:
        return self.folder / "audit.jsonl"

    @property
    def state(self) -> Path:
        return self.folder / "observer.state"

    def env(self) -> dict[str, str]:
        return rel_support.child_env(
            THROUGHLINE_BOOTSTRAP_SERVERS=self.bootstrap,
            THROUGHLINE_TOPIC=self.topic,
            THROUGHLINE_TOKEN_KEY=KEY_HEX,
            PYTHONFAULTHANDLER="1",  # a serve that hangs is sent SIGABRT: its threads' stacks land in stderr
        )

    def mark(self, what: str) -> None:
        print(f"  +{time.monotonic() - self.t0:5.1f}s {what}", flush=True)

    def start(self) -> ClusterWorld:
        """Create the topic, start serve, the Observer and the senders."""
        # throughline's own creation: on three brokers, RF 3 and min.insync.replicas 2 by default
        info = ensure_topic(self.bootstrap, self.topic, partitions=PARTITIONS)
        assert info.created and [len(r.replicas) for r in info.replicas] == [3] * PARTITIONS
        assert info.configs.get("min.insync.replicas") == TOPIC_CONFIGS["min.insync.replicas"]
        assert info.configs.get("unclean.leader.election.enable") == "false"
        workload = Workload(
            self.seed, (OBSERVED, *OTHERS), switch_every=6, rollback_every=8, steady=frozenset({OBSERVED})
        )
        with TurnProducer(self.bootstrap, self.topic, partitions=PARTITIONS) as producer:
            first = [workload.next_turn(OBSERVED) for _ in range(2)]
            self.initial = [
                (turn.turn_id, where.partition, where.offset, time.monotonic())
                for turn, where in zip(first, producer.send_many(first), strict=True)
            ]
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = self.env()
        self.serve = Child(
            "serve",
            ["serve", "--port", str(port), "--db", str(self.db), "--read-wait", "2", "--log-level", "info"],
            self.folder,
            env,
        ).start()
        audit_cmd = f"cat >> {shlex.quote(str(self.audit))}; echo >> {shlex.quote(str(self.audit))}"
        self.observer = Child(
            "observer",
            [
                "observe",
                "--follow",
                "--url",
                self.url,
                "--project",
                OBSERVED,
                "--state",
                str(self.state),
                "--exec",
                audit_cmd,
                "--limit",
                "5",
                "--interval",
                "0.1",
                "--max-pending-wait",
                "600",
            ],
            self.folder,
            env,
        )
        wait_until(
            lambda: rel_support.readyz_lag(self.url, timeout=10) is not None,
            timeout=120,
            what="serve to answer",
        )
        self.observer.start()
        # The Observer's first contact is with the two turns above; the senders start after its first save.
        wait_until(lambda: _saved_length(self.state) == 2, timeout=120, what="the Observer's first saved cursor")
        self.senders = [
            RetryingSender(
                self.bootstrap,
                self.topic,
                workload,
                (OBSERVED, OTHERS[0]),
                PARTITIONS,
                send_timeout_s=SEND_TIMEOUT_S,
                give_up_s=240,
            ),
            RetryingSender(
                self.bootstrap,
                self.topic,
                workload,
                OTHERS[1:],
                PARTITIONS,
                send_timeout_s=SEND_TIMEOUT_S,
                give_up_s=240,
            ),
        ]
        self.threads = [threading.Thread(target=s.run, daemon=True) for s in self.senders]
        for t in self.threads:
            t.start()
        self.mark("serve, Observer and senders running")
        return self

    def busy_partition(self) -> int:
        """The observed project's partition (every sender's first project lands there or beside it)."""
        return rel_support.project_partition(OBSERVED, PARTITIONS)

    def acked(self) -> list[tuple[str, int, int, float]]:
        return [a for s in self.senders for a in s.acked]

    def wait_progress(self, turns: int = 20, timeout: float = 120.0) -> None:
        """Wait (bounded) until the senders had ``turns`` more acknowledged: traffic flows again."""
        before = len(self.acked())
        wait_until(
            lambda: len(self.acked()) >= before + turns,
            timeout=timeout,
            what=f"{turns} more acknowledged turns",
        )

    def stop_serve(self) -> float:
        """SIGTERM serve and measure its exit (bounded: a serve still running after ``SHUTDOWN_BOUND_S`` is
        sent SIGABRT, which prints its threads' stacks, and the test fails)."""
        assert self.serve is not None and self.serve.proc is not None
        started = time.monotonic()
        self.serve.proc.send_signal(signal.SIGTERM)
        try:
            code = self.serve.proc.wait(timeout=SHUTDOWN_BOUND_S)
        except Exception:
            self.serve.proc.send_signal(signal.SIGABRT)
            self.serve.proc.wait(timeout=30)
            raise AssertionError(
                f"serve did not exit within {SHUTDOWN_BOUND_S:g}s of SIGTERM; its stacks:\n{self.serve.stderr(20000)}"
            ) from None
        self.shutdown_s = time.monotonic() - started
        self.serve.exits.append(code)
        assert code == 0, f"serve exited {code} on SIGTERM:\n{self.serve.stderr()}"
        return self.shutdown_s

    def finish(self) -> dict[str, Any]:
        """Stop the senders, catch up, stop serve and the Observer, and check everything; the counts."""
        assert self.serve is not None and self.observer is not None
        for s in self.senders:
            s.stop.set()
        for t in self.threads:
            t.join(timeout=SEND_TIMEOUT_S * 3 + 30)
        for s in self.senders:
            assert s.error is None, s.error
        self.mark("senders stopped")
        stored, ends = read_topic_and_ends(self.bootstrap, self.topic)
        fold = fold_log(stored, PARTITIONS)
        head = len(fold.book.live[fold.book.heads[project_sha256(OBSERVED)]])
        wait_until(
            lambda: rel_support.readyz_lag(self.url, timeout=10) == 0,
            timeout=CATCH_UP_TIMEOUT,
            what="serve to apply the whole log",
        )
        wait_until(
            lambda: _saved_length(self.state) == head,
            timeout=CATCH_UP_TIMEOUT,
            what="the Observer to reach the head",
        )
        self.mark("serve and Observer caught up")
        # serve first: it answers the Observer's long-poll in flight at once, which the Observer, stopped
        # first, would wait out (25 s) before it exits.
        self.stop_serve()
        self.mark(f"serve stopped in {self.shutdown_s:.1f}s")
        assert self.observer.terminate() == 0, self.observer.stderr()
        return self.check(stored, ends, fold, head)

    def check(self, stored: list[Any], ends: dict[int, int], fold: rel_support.Fold, head: int) -> dict[str, Any]:
        """The invariants after the run (see the module docstring); the counts."""
        by_position = {(s.partition, s.offset): s for s in stored}
        acked = self.initial + self.acked()
        lost = [a for a in acked if (a[1], a[2]) not in by_position]
        assert not lost, f"{len(lost)} acknowledged turns are not in the log: {lost[:3]}"
        in_log_twice = sum(1 for where in fold.by_turn_id.values() if len(where) > 1)
        compared = check_projection(self.db, fold, ends, topic=self.topic)  # nothing lost, nothing live twice
        audited = _check_audit(self.audit, fold, head)
        failures = [code for s in self.senders for _, code, _ in s.failures]
        return {
            "acknowledged": len(acked),
            "records": len(stored),
            "lost": 0,
            "doubled": 0,
            "in_log_twice_applied_once": in_log_twice,
            "live_turns": compared["live_turns"],
            "audited": audited,
            "send_failures": len(failures),
            "send_failure_codes": sorted(set(failures)),
            "serve_shutdown_seconds": round(self.shutdown_s or 0.0, 1),
        }

    def close(self) -> None:
        """Stop whatever still runs (after a failure)."""
        for s in self.senders:
            s.stop.set()
        for child in (self.observer, self.serve):
            if child is not None:
                child.stop_quietly()


def _saved_length(state: Path) -> int | None:
    from throughline.core.cursor import Cursor, decode_cursor

    cursor = load_observer_state(state)
    if cursor is None:
        return None
    decoded = decode_cursor(cursor)
    assert isinstance(decoded, Cursor)
    return decoded.length


def _check_audit(audit: Path, fold: rel_support.Fold, head: int) -> int:
    """The audit trail is the observed project's chain: seqs 1..head, each once, in order, each the turn
    the log holds there. Returns how many turns were audited."""
    lines = [json.loads(raw) for raw in audit.read_text(encoding="utf-8").splitlines() if raw.strip()]
    chain = fold.book.live[fold.book.heads[project_sha256(OBSERVED)]]
    assert [line["seq"] for line in lines] == list(range(1, head + 1)), (
        f"the audit trail is not 1..{head} once each in order: {[line['seq'] for line in lines][:20]}..."
    )
    for line in lines:
        turn = chain[line["seq"] - 1]
        assert (line["contentDigest"], line["chainDigest"]) == (
            turn.content_digest.hex(),
            turn.chain_digest.hex(),
        )
        assert line["body"] == turn.record.body
    return len(lines)
