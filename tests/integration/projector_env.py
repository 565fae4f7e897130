"""Helpers for the projector's integration tests (not a test module): produce turns and raw records to
the real broker, read the whole topic back, fold it with the reference ``ChainBook`` and compare a
DuckDB projection with it.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka import KafkaProducer
from support.fold import fold_records
from support.topic import read_topic_and_ends
from support.world import make_turn

from throughline.cli import main
from throughline.core.chain import chain_digests, content_digest
from throughline.core.fold import ChainBook
from throughline.core.partitioning import partition_for
from throughline.core.turn import TurnRecord
from throughline.projector.store import DuckProjection
from throughline.schemas.codec import encode_turn

TIMEOUT = 30.0


def turn(
    project: str, thread: str, turn_id: str, *, seq: int | None = None, host: str = "host-a", body: str | None = None
) -> TurnRecord:
    """A valid turn (``support.world.make_turn``) completed at a time its id fixes, with a deterministic
    body when none is given."""
    at = 1_760_000_000_000_000 + sum(map(ord, turn_id))
    text = body if body is not None else f"{project}/{thread}/{turn_id} " + "x" * 200
    return make_turn(project, host, thread, turn_id, at=at, body=text, seq=seq)


class Producer:
    """A kafka-python producer that places each turn on its project's partition (as ``TurnProducer`` does)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.topic = topic
        self.partitions = partitions
        self._producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, retries=5)

    def send(self, record: TurnRecord) -> None:
        """Append one turn (asynchronously; ``flush`` waits)."""
        key = record.project_sha256
        self._producer.send(
            self.topic, key=key, value=encode_turn(record), partition=partition_for(key, self.partitions)
        )

    def send_raw(self, partition: int, key: bytes | None, value: bytes | None) -> None:
        """Append raw bytes to a partition (poison records)."""
        self._producer.send(self.topic, key=key, value=value, partition=partition).get(timeout=TIMEOUT)

    def flush(self) -> None:
        self._producer.flush(timeout=TIMEOUT)

    def close(self) -> None:
        self._producer.close(timeout=10)


def history(rng: random.Random, size: int, *, projects: int = 8, threads: int = 3) -> list[TurnRecord]:
    """A realistic mixed history: appends, retries (duplicates), rewinds, host switches and a few gaps."""
    lengths: dict[tuple[str, str, str], int] = {}
    out: list[TurnRecord] = []
    for i in range(size):
        project = f"/work/p{rng.randrange(projects)}"
        thread = f"t{rng.randrange(threads)}"
        host = "host-a" if rng.random() < 0.9 else "host-b"
        key = (project, host, thread)
        n = lengths.get(key, 0)
        roll = rng.random()
        if out and roll < 0.04:
            out.append(out[rng.randrange(len(out))])  # a retried append
            continue
        if n and roll < 0.09:
            seq = rng.randint(1, n)  # a rewind
        elif roll < 0.095:
            seq = n + 2  # a gap (quarantined)
        else:
            seq = None if rng.random() < 0.5 else n + 1
        out.append(turn(project, thread, f"turn-{i}", seq=seq, host=host))
        if seq is None or seq <= n + 1:
            lengths[key] = seq if seq is not None else n + 1
    return out


@dataclass(frozen=True)
class LogContent:
    """Everything in the topic, as read back from the broker."""

    ends: dict[int, int]
    book: ChainBook
    undecodable: list[tuple[int, int]]


def fold_topic(bootstrap: str, topic: str) -> LogContent:
    """Read every record of the topic back (``support.topic``) and fold it, partition by partition, with ``ChainBook``."""
    stored, ends = read_topic_and_ends(bootstrap, topic)
    book, undecodable = fold_records(stored)  # turns and repairs
    return LogContent(ends, book, undecodable)


def table_columns(projection: DuckProjection, table: str, *columns: str) -> list[tuple[Any, ...]]:
    """The given columns of every row of ``table``, in the table's total order (``table_rows``)."""
    return [tuple(r[c] for c in columns) for r in projection.table_rows(table)]


def assert_projection_equals_log(db: Path, content: LogContent) -> None:
    """The projection holds exactly what the log says: no turn lost, none twice, every digest verified."""
    book = content.book
    with DuckProjection.open(db, read_only=True) as projection:
        applied = projection.applied_offsets()
        assert {p: applied.get(p, 0) for p in content.ends} == content.ends
        live = table_columns(
            projection,
            "turns",
            "source_sha256",
            "seq",
            "turn_id",
            "completed_at_us",
            "body",
            "content_digest",
            "chain_digest",
            "log_partition",
            "log_offset",
        )  # ordered by source, seq
        expected = sorted(
            (
                s,
                t.seq,
                t.turn_id,
                t.record.completed_at_micros,
                t.record.body,
                t.content_digest,
                t.chain_digest,
                t.partition,
                t.offset,
            )
            for s, turns in book.live.items()
            for t in turns
        )
        assert len(live) == len(expected), f"{len(live)} live turns projected, the log says {len(expected)}"
        assert live == expected
        # None twice: one row per (source, seq) and per (source, turn id).
        assert len({(r[0], r[1]) for r in live}) == len(live)
        assert len({(r[0], r[2]) for r in live}) == len(live)
        # Every digest verified from the stored content.
        chains: dict[bytes, list[tuple[int, bytes, bytes]]] = {}
        for source, seq, turn_id, at, body, cd, dd, _, _ in live:
            assert content_digest(turn_id, at, body) == cd
            chains.setdefault(source, []).append((seq, cd, dd))
        for rows in chains.values():
            assert [r[0] for r in rows] == list(range(1, len(rows) + 1))
            assert chain_digests([r[1] for r in rows]) == [r[2] for r in rows]
        superseded = table_columns(projection, "superseded_turns", "source_sha256", "seq", "turn_id", "log_offset")
        assert sorted(superseded) == sorted(
            (t.record.source_sha256, t.seq, t.turn_id, t.offset) for t in book.superseded
        )
        heads = dict(table_columns(projection, "project_heads", "project_sha256", "source_sha256"))
        assert heads == book.heads
        quarantine = table_columns(
            projection, "quarantine", "log_partition", "log_offset", "repaired_partition", "repaired_offset"
        )
        assert sorted((p, o) for p, o, _, _ in quarantine) == sorted(
            [(p, o) for p, o, _ in book.quarantined] + content.undecodable
        )
        # Repairs: each applied once, marks and broken marks as the reference fold decides them.
        assert {(p, o): (rp, ro) for p, o, rp, ro in quarantine if ro is not None} == book.repaired
        repairs = table_columns(
            projection, "repairs", "log_partition", "log_offset", "source_sha256", "outcome", "marked", "length"
        )
        assert repairs == sorted(
            (r.partition, r.offset, r.source_sha256, r.outcome.status, r.outcome.marked, r.length) for r in book.repairs
        )
        broken = {r["source_sha256"] for r in projection.table_rows("sources") if r["broken_reason"] is not None}
        assert broken == book.broken


def cli(*argv: str) -> tuple[int, str, str]:
    """``throughline ARGV`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def cli_process(
    *argv: str, timeout: float = 120.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``throughline ARGV`` as a real process (with ``env`` as its environment when given)."""
    return subprocess.run(
        [sys.executable, "-m", "throughline.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


#: What the fetch worker raises under ``worker_fault_env`` (tests/integration/worker_fault/sitecustomize.py).
WORKER_FAULT = "injected fetch worker failure"


def worker_fault_env(tmp: Path) -> tuple[dict[str, str], Path]:
    """An environment in which the first fetch worker of a ``throughline`` process raises ``RuntimeError``
    once (not a Kafka error, not a kill), and the marker file whose removal shows that it did."""
    marker = tmp / "worker-fault.armed"
    marker.write_text("armed")
    faults = Path(__file__).resolve().parent / "worker_fault"
    path = os.environ.get("PYTHONPATH", "")
    env = {
        **os.environ,
        "THROUGHLINE_TEST_WORKER_FAULT": str(marker),
        "PYTHONPATH": f"{faults}{os.pathsep}{path}" if path else str(faults),
    }
    return env, marker


def start_projector(*argv: str, log: Path) -> subprocess.Popen[bytes]:
    """Start ``throughline project ARGV`` as a real process (its stderr goes to ``log``)."""
    with open(log, "ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "throughline.cli", "project", *argv], stdout=subprocess.DEVNULL, stderr=err
        )


def connection(bootstrap: str, topic: str, db: Path) -> list[str]:
    """The connection flags of every command."""
    return ["--bootstrap-servers", bootstrap, "--topic", topic, "--db", str(db)]


def produce_all(bootstrap: str, topic: str, partitions: int, records: Sequence[TurnRecord]) -> None:
    """Produce turns and wait for every acknowledgement."""
    producer = Producer(bootstrap, topic, partitions)
    try:
        for r in records:
            producer.send(r)
        producer.flush()
    finally:
        producer.close()


def exactly_once_invariants(db: Path) -> int:
    """Check what must hold after a crash at any instant; return the total applied offset.

    Every appended turn is either live or superseded (none lost), no record was applied twice (each log
    position is one row), every turn id the tables hold is recorded once in ``turn_ids``, and the
    per-partition counters add up to what the tables hold. A turn id may have a live row and superseded
    ones: an amend, or a stale-looking re-send completed after the chain's head, places it again.
    """
    with DuckProjection.open(db, read_only=True) as projection:
        counters = projection.table_rows("applied_offsets")
        appended, records, quarantined, applied = (
            sum(int(c[k]) for c in counters) for k in ("appended", "records", "quarantined", "next_offset")
        )
        rows = [*projection.table_rows("turns"), *projection.table_rows("superseded_turns")]
        ids = len(projection.table_rows("turn_ids"))  # one row a (source, turn id): its key is their hash
        q = len(projection.table_rows("quarantine"))
    assert appended == len(rows), (appended, len(rows))
    positions = {(r["log_partition"], r["log_offset"]) for r in rows}
    assert len(positions) == len(rows), "a record was applied twice"
    assert ids == len({(r["source_sha256"], r["turn_id"]) for r in rows})
    assert quarantined == q
    assert records <= applied
    return int(applied)
