"""Log backups killed (docs/reliability.md, "Log backups killed mid-run"): SIGKILL ``throughline export``
and ``throughline import`` at seeded random moments, run them again, and check that nothing was lost or
doubled.

One real broker; a topic of 3 partitions holding ``THROUGHLINE_BACKUP_RECORDS`` records (default 30,000,
incompressible values of 1-2 KB, some with headers) so that a run lasts a few seconds. The export is
started, killed after a seeded random delay (``THROUGHLINE_BACKUP_SEED`` replays it), started again,
and so on ``THROUGHLINE_BACKUP_KILLS`` times (default 3), then run to its end: the files must then hold
every record of the topic once, in order, byte for byte (a kill mid-file leaves a torn last block that
the next run cuts off, ``salvaged`` in its summary). After every kill the manifest must still load and
every file it lists must match its SHA-256. Then the import likewise, killed and resumed with
``--resume``: the new topic must hold every record once, in order.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import rel_support
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from rel_support import Child, child_env, env_int

from throughline.backup import load_manifest
from throughline.backup.files import read_file
from throughline.backup.manifest import verify_files
from throughline.testing import create_topic

PARTITIONS = 3
READ_TIMEOUT = 120.0
RUN_TIMEOUT = 300.0


def _fill(bootstrap: str, topic: str, count: int, rng: random.Random) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, batch_size=256 * 1024)
    try:
        for i in range(count):
            headers = [("n", str(i).encode())] if i % 7 == 0 else []
            value = rng.randbytes(1024 + rng.randrange(1024))
            producer.send(topic, key=b"k%d" % (i % 50), value=value, headers=headers, partition=i % PARTITIONS)
        producer.flush(timeout=60)
    finally:
        producer.close(timeout=10)


def _records(bootstrap: str, topic: str) -> dict[int, list[tuple[Any, ...]]]:
    """(timestamp, key, value, headers) of every committed record, by partition (plain kafka-python)."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, isolation_level="read_committed", fetch_max_bytes=64 << 20
    )
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        out: dict[int, list[tuple[Any, ...]]] = {p: [] for p in range(PARTITIONS)}
        deadline = time.monotonic() + READ_TIMEOUT
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, "could not read the topic to its end in time"
            for tp, records in consumer.poll(timeout_ms=500).items():
                out[tp.partition].extend(
                    (r.timestamp, r.key, r.value, tuple(r.headers or ())) for r in records if r.offset < ends[tp]
                )
        return out
    finally:
        consumer.close()


def _kill_and_rerun(child: Child, rng: random.Random, kills: int, check: Any) -> tuple[int, int]:
    """Start ``child``, SIGKILL it after a random delay, ``check()``, ``kills`` times; then a run to its
    end. Returns (kills that hit a live process, runs)."""
    hit = 0
    for _ in range(kills):
        child.start()
        time.sleep(rng.uniform(0.6, 2.0))  # start-up takes ~0.7 s, 30k records ~2 s: most kills land mid-copy
        if child.sigkill():
            hit += 1
        check()
    child.start()
    code = child.wait(RUN_TIMEOUT)
    assert code == 0, child.stderr()
    return hit, child.starts


def test_export_and_import_killed_lose_and_double_nothing(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    seed = env_int("THROUGHLINE_BACKUP_SEED", random.randrange(1 << 30))
    print(f"THROUGHLINE_BACKUP_SEED={seed}")
    rng = random.Random(seed)
    count = env_int("THROUGHLINE_BACKUP_RECORDS", 30_000)
    kills = env_int("THROUGHLINE_BACKUP_KILLS", 3)
    topic, copy = kafka_topic_name, f"{kafka_topic_name}-restored"
    create_topic(kafka_bootstrap, topic, partitions=PARTITIONS, configs={"retention.ms": "-1", "retention.bytes": "-1"})
    _fill(kafka_bootstrap, topic, count, rng)
    source = _records(kafka_bootstrap, topic)
    backup = tmp_path / "backup"
    env = child_env()
    log = ["--bootstrap-servers", kafka_bootstrap, "--no-progress"]

    def manifest_still_whole() -> None:
        manifest = load_manifest(backup)
        if manifest is not None:
            verify_files(backup, manifest, sorted(manifest.partitions))

    export = Child("export", ["export", "--out", str(backup), "--topic", topic, *log], tmp_path, env)
    export_kills, export_runs = _kill_and_rerun(export, rng, kills, manifest_still_whole)
    salvaged = sum(
        len(json.loads((tmp_path / f"export.{n}.out").read_text() or "{}").get("salvaged", []))
        for n in range(1, export.starts + 1)
        if (tmp_path / f"export.{n}.out").exists() and (tmp_path / f"export.{n}.out").read_text().strip()
    )
    manifest = load_manifest(backup)
    assert manifest is not None
    verify_files(backup, manifest, list(range(PARTITIONS)))
    lost = doubled = 0
    for p in range(PARTITIONS):
        in_files = [
            (r.timestamp, r.key, r.value, r.headers)
            for f in manifest.partitions[p].files
            for r in read_file(backup / f.name)
        ]
        offsets = [r.offset for f in manifest.partitions[p].files for r in read_file(backup / f.name)]
        doubled += len(offsets) - len(set(offsets))
        lost += len(source[p]) - len(set(offsets))
        assert offsets == list(range(len(source[p]))) and in_files == source[p], f"partition {p}"

    restore = Child("import", ["import", str(backup), "--topic", copy, *log], tmp_path, env)
    import_kills = 0
    for _ in range(kills):
        restore.start()
        time.sleep(rng.uniform(0.8, 2.5))
        if restore.sigkill():
            import_kills += 1
        restore.argv = [*restore.argv[:3], "import", str(backup), "--topic", copy, "--resume", *log]
    restore.start()
    code = restore.wait(RUN_TIMEOUT)
    assert code == 0, restore.stderr()
    restored = _records(kafka_bootstrap, copy)
    for p in range(PARTITIONS):
        assert restored[p] == source[p], f"partition {p} of the restored topic"
    rel_support.record(
        "backup",
        "kills",
        records=count,
        export_kills=export_kills,
        export_runs=export_runs,
        salvaged_files=salvaged,
        import_kills=import_kills,
        import_runs=restore.starts,
        lost=lost,
        doubled=doubled,
        seed=seed,
    )
    print("\n".join(rel_support.summary_lines()))
    assert (lost, doubled) == (0, 0)
