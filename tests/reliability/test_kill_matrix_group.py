"""Kill matrix, group scenario (docs/reliability.md#1-kill-matrix): SIGKILL members of a ``serve --group``.

One real broker, one topic of 6 partitions; turns are produced steadily (thread switches and rollbacks
on the other projects) while three ``throughline serve --group`` members run (each its own DuckDB file
and port; K = 2 copies), the reference Observer follows one project through ``--url U1,U2,U3`` and HTTP
readers page the other projects through the same three URLs. A seeded schedule (``THROUGHLINE_KILL_SEED``
replays it; ``THROUGHLINE_GROUP_KILLS`` sets the count) SIGKILLs a random member at a random moment and
restarts it at once on the same file and port (it rejoins the group and catches up from its file).

After every kill the killed member's file must equal the fold of exactly the log prefix its applied
offsets name, partition by partition (a member applies only what it holds). At the end, ingest stopped
and the group settled: every acknowledged turn is in the log once; every member's file equals the fold
of its applied prefix and has applied the whole log on the partitions it holds; the Observer's audit
trail is exactly 1..head (true turns, no gap, nothing audited twice); no reader saw an unhandled error.
"""

from __future__ import annotations

import os
import random
import shlex
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import rel_support
import test_kill_matrix as km
from rel_support import Child, Workload, wait_until

from throughline.errors import ThroughlineError
from throughline.log import ensure_topic
from throughline.producers.producer import TurnProducer
from throughline.testing.kafka import free_port

pytestmark = pytest.mark.integration

KILLS = rel_support.env_int("THROUGHLINE_GROUP_KILLS", 6)
PARTITIONS = 6
MEMBERS = 3
SESSION_TIMEOUT_MS = 6000
CATCH_UP_TIMEOUT = 180.0


class GroupReaders(km.Readers):
    """``km.Readers`` through every member's URL; a retriable error (a forward to a holder being killed)
    is counted, not failed, as the Observer backs off from it."""

    def failed(self, exc: Exception) -> None:
        if isinstance(exc, ThroughlineError) and exc.retriable:
            self.bump(f"retriable:{exc.code}")
        else:
            super().failed(exc)


def _prefix_check(bootstrap: str, topic: str, db: Path) -> dict[int, int]:
    """The member's file equals the fold of exactly its applied log prefix (partition by partition)."""
    return rel_support.check_applied_prefix(bootstrap, topic, db, PARTITIONS, missing_ok=True)


def _group(url: str) -> dict[str, Any] | None:
    try:
        status, doc = rel_support.http_json(url + "/readyz", timeout=10)
    except OSError:
        return None
    return doc.get("group") if isinstance(doc, dict) else None


def _settled(urls: list[str]) -> bool:
    groups = [_group(u) for u in urls]
    if not all(g and g.get("joined") and g.get("members") for g in groups):
        return False
    return (
        len({g["generation"] for g in groups}) == 1  # type: ignore[index]
        and all({m["url"] for m in g["members"]} == set(urls) for g in groups)  # type: ignore[index]
        and all(g["catchingUp"] == [] and g["heldLag"] == 0 for g in groups)  # type: ignore[index]
    )


def _held_twice(urls: list[str]) -> dict[int, list[int]] | None:
    """What each member holds, once the group is settled and every partition has its two copies."""
    if not _settled(urls):
        return None
    held = {i: list((_group(u) or {}).get("held") or []) for i, u in enumerate(urls)}
    counts = dict.fromkeys(range(PARTITIONS), 0)
    for parts in held.values():
        for p in parts:
            counts[p] += 1
    return held if all(n == 2 for n in counts.values()) else None


def test_kill_matrix_group(kafka_bootstrap: str, kafka_topic_name: str, kafka_group_id: str, tmp_path: Path) -> None:
    seed = rel_support.env_int("THROUGHLINE_KILL_SEED", int.from_bytes(os.urandom(4), "big"))
    print(f"\nkill matrix (group): seed {seed} (replay with THROUGHLINE_KILL_SEED={seed}), {KILLS} kills")
    rng = random.Random(seed)
    topic = kafka_topic_name
    ensure_topic(kafka_bootstrap, topic, partitions=PARTITIONS)
    ports = [free_port() for _ in range(MEMBERS)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    dbs = [tmp_path / f"m{i}.duckdb" for i in range(MEMBERS)]
    state, audit = tmp_path / "observer.state", tmp_path / "audit.jsonl"
    env = rel_support.child_env(
        THROUGHLINE_BOOTSTRAP_SERVERS=kafka_bootstrap,
        THROUGHLINE_TOPIC=topic,
        THROUGHLINE_TOKEN_KEY=km.KEY_HEX,
        THROUGHLINE_GROUP=kafka_group_id,
        THROUGHLINE_GROUP_SESSION_TIMEOUT_MS=str(SESSION_TIMEOUT_MS),
    )
    members = [
        Child(
            f"m{i}",
            [
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(ports[i]),
                "--db",
                str(dbs[i]),
                "--read-wait",
                "2",
                "--advertise",
                urls[i],
            ],
            tmp_path,
            env,
        )
        for i in range(MEMBERS)
    ]
    audit_cmd = f"cat >> {shlex.quote(str(audit))}; echo >> {shlex.quote(str(audit))}"
    observer = Child(
        "observer",
        [
            "observe",
            "--follow",
            "--url",
            ",".join(urls),
            "--project",
            km.OBSERVED,
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
    )
    workload = Workload(
        seed, (km.OBSERVED, *km.OTHERS), switch_every=6, rollback_every=8, steady=frozenset({km.OBSERVED})
    )
    ingest = km.Ingest(kafka_bootstrap, topic, workload, partitions=PARTITIONS)
    readers = GroupReaders(",".join(urls))
    threads: list[threading.Thread] = []
    prefix_checks = 0
    kills = [0] * MEMBERS
    started = time.monotonic()
    try:
        with TurnProducer(kafka_bootstrap, topic, partitions=PARTITIONS) as producer:
            producer.send_many([workload.next_turn(km.OBSERVED) for _ in range(2)])
        for m in members:
            m.start()
        wait_until(lambda: _settled(urls), timeout=120, what="three members in one generation")
        observer.start()
        wait_until(lambda: state.exists() and km._saved_length(state) == 2, timeout=120, what="the first saved cursor")
        threads = [threading.Thread(target=ingest.run, name="ingest", daemon=True)]
        threads += [
            threading.Thread(target=readers.run, args=(seed + i,), name=f"reader-{i}", daemon=True) for i in range(2)
        ]
        for t in threads:
            t.start()

        for _ in range(KILLS):
            i = rng.randrange(MEMBERS)
            child = members[i]
            due = child.started_at + rng.uniform(1.0, 8.0)
            time.sleep(max(0.0, due - time.monotonic()))
            assert child.alive(), f"m{i} ended on its own:\n{child.stderr()}"
            assert observer.alive(), f"the Observer ended:\n{observer.stderr()}"
            assert ingest.error is None, ingest.error
            assert child.sigkill()
            kills[i] += 1
            _prefix_check(kafka_bootstrap, topic, dbs[i])
            prefix_checks += 1
            child.start()

        stored, ends, fold, head = km.stop_and_fold(ingest, threads[0], kafka_bootstrap, topic, PARTITIONS)
        wait_until(lambda: _settled(urls), timeout=CATCH_UP_TIMEOUT, what="the group to settle and catch up")
        wait_until(
            lambda: km._saved_length(state) == head, timeout=CATCH_UP_TIMEOUT, what="the Observer to reach the head"
        )
        readers.stop.set()
        for t in threads[1:]:
            t.join(timeout=60)
        # Seen once in CI: read right after the group settled, the held lists gave every partition one
        # live copy (a rebalance under way as they were read; cause not pinned down). What the group
        # promises is that both copies come back: wait for them within the bound, then check below
        # that every holder applied its partitions to the end.
        held: dict[int, list[int]] = wait_until(
            lambda: _held_twice(urls), timeout=CATCH_UP_TIMEOUT, what="two live copies of every partition"
        )
        assert observer.terminate() == 0, observer.stderr()
        for i, m in enumerate(members):
            code = m.terminate()
            assert code == 0, f"m{i} exited {code} on SIGTERM:\n{m.stderr()}"

        positions = {(p, o) for _, p, o in ingest.acked}
        by_position = {(s.partition, s.offset) for s in stored}
        assert positions <= by_position, "acknowledged records are missing from the log"
        assert not {t: w for t, w in fold.by_turn_id.items() if len(w) > 1}, "a turn is in the log twice"
        holders = dict.fromkeys(range(PARTITIONS), 0)
        for i, db in enumerate(dbs):
            applied = _prefix_check(kafka_bootstrap, topic, db)
            for p in held[i]:
                assert applied.get(p, 0) == ends[p], f"m{i} holds {p} but applied {applied.get(p)} of {ends[p]}"
                holders[p] += 1
        assert all(n == 2 for n in holders.values()), holders
        audited, reaudited, partial = km._check_audit(audit, [(0, None)], fold, head)
    finally:
        ingest.stop.set()
        readers.stop.set()
        observer.stop_quietly()
        for m in members:
            m.stop_quietly()

    took = time.monotonic() - started
    print(
        f"kill matrix (group): kills {kills}, records {len(stored)}, reads {readers.counts}, audited {audited}, {took:.0f} s"
    )
    rel_support.record("kill", "group", kills=sum(kills), restarts=sum(kills))
    rel_support.record(
        "kill",
        "group_invariants",
        seed=seed,
        members=MEMBERS,
        kills=sum(kills),
        records=len(stored),
        acknowledged=len(ingest.acked),
        lost=0,
        doubled=0,
        unhandled=len(readers.failures),
        prefix_checks=prefix_checks,
        audited_turns=audited,
        audit_gaps=0,
        audit_duplicates=0,
        reaudited=reaudited,
        cut_lines=partial,
        http_reads=sum(readers.counts.values()),
        http_unavailable=readers.counts.get("unavailable", 0),
        http_retriable=sum(v for k, v in readers.counts.items() if k.startswith("retriable:")),
        seconds=round(took),
    )
    assert not readers.failures, readers.failures[:5]
