"""SIGKILL the projector at random moments while thousands of turns are ingested (real broker).

After a final catch-up the projection must equal what the log says (no turn lost, none twice, every
chain digest verified), and a replay of the same log into a new file must give identical tables.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path

from projector_env import (
    Producer,
    assert_projection_equals_log,
    cli_process,
    connection,
    exactly_once_invariants,
    fold_topic,
    history,
    start_projector,
)

from throughline.projector.store import DuckProjection
from throughline.testing import create_topic

PARTITIONS = 3
TURNS = 10_000
BACKLOG = 6_000  # produced before the first start, so early kills land while the projector is busy
KILLS = 10
WINDOW_MAX_S = 8.0  # the latest a kill's window may start (seconds after the projector's start)


def test_sigkill_at_random_moments_loses_nothing_and_applies_nothing_twice(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    seed = int(os.environ.get("THROUGHLINE_CRASH_SEED", random.randrange(2**32)))
    print(f"crash test seed {seed} (THROUGHLINE_CRASH_SEED={seed} replays it)")
    rng = random.Random(seed)
    topic = kafka_topic_name
    create_topic(kafka_bootstrap, topic, partitions=PARTITIONS, configs={"retention.ms": "-1", "retention.bytes": "-1"})
    db = tmp_path / "projection.duckdb"
    log = tmp_path / "projector.log"
    flags = connection(kafka_bootstrap, topic, db)
    records = history(rng, TURNS)

    # Ingest steadily in the background while the projector is killed again and again.
    errors: list[BaseException] = []

    backlog = Producer(kafka_bootstrap, topic, PARTITIONS)
    for r in records[:BACKLOG]:
        backlog.send(r)
    backlog.flush()
    backlog.close()

    def ingest() -> None:
        producer = Producer(kafka_bootstrap, topic, PARTITIONS)
        try:
            for i in range(BACKLOG, len(records), 100):
                for r in records[i : i + 100]:
                    producer.send(r)
                producer.flush()
                time.sleep(0.35)
        except BaseException as exc:
            errors.append(exc)
        finally:
            producer.close()

    ingester = threading.Thread(target=ingest, name="ingest")
    ingester.start()

    applied_seen: list[int] = []
    busy_checked = False
    # Imports and connecting take most of the first second on a quiet machine; on a loaded one they can
    # take the whole window, so a round that applied nothing moves the window later (bounded).
    window = (0.8, 2.6)
    try:
        for _ in range(KILLS):
            before = applied_seen[-1] if applied_seen else 0
            # Small polls: many transactions, so a kill often lands inside one.
            proc = start_projector(*flags, "--check-interval", "1", "--max-poll-records", "100", log=log)
            try:
                time.sleep(rng.uniform(*window))
                if not busy_checked:
                    status = cli_process("status", *flags)
                    assert status.returncode == 1, status
                    assert json.loads(status.stderr.strip().splitlines()[-1])["error"]["code"] == "projection_busy"
                    busy_checked = True
                assert proc.poll() is None, f"the projector exited on its own:\n{log.read_text()[-3000:]}"
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
            if db.exists():
                applied_seen.append(exactly_once_invariants(db))
            if (applied_seen[-1] if applied_seen else 0) == before:  # this round applied nothing
                window = (min(window[0] + 1.0, WINDOW_MAX_S), min(window[1] + 1.0, WINDOW_MAX_S + 1.8))
    finally:
        ingester.join(timeout=120)
    assert not errors, errors
    print(f"applied offsets after each kill: {applied_seen}")
    assert applied_seen == sorted(applied_seen), f"a commit was lost: applied offsets went {applied_seen}"
    assert len(set(applied_seen)) >= 3, f"the projector barely ran between kills: {applied_seen}"

    final = cli_process("project", "--until-caught-up", *flags)
    assert final.returncode == 0, final.stderr[-3000:]
    summary = json.loads(final.stdout)
    assert summary["caughtUp"] is True

    content = fold_topic(kafka_bootstrap, topic)
    assert sum(content.ends.values()) == len(records)
    assert_projection_equals_log(db, content)
    exactly_once_invariants(db)

    # Replay of the same log into a new file: identical tables.
    replayed = tmp_path / "replayed.duckdb"
    result = cli_process("replay", *connection(kafka_bootstrap, topic, replayed), "--no-progress")
    assert result.returncode == 0, result.stderr[-3000:]
    with DuckProjection.open(db, read_only=True) as a, DuckProjection.open(replayed, read_only=True) as b:
        assert a.table_digests() == b.table_digests()
