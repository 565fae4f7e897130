"""Projection snapshots killed (docs/reliability.md, "Projection snapshots killed mid-run"): SIGKILL
``throughline snapshot`` (the peer taking one) and ``throughline load-snapshot`` (the new projection being
built from one, what ``serve --bootstrap-from`` runs before it serves) at seeded random moments.

One real broker; a topic of 3 partitions holding ``THROUGHLINE_SNAPSHOT_TURNS`` turns (default 6,000, 2 KB
bodies) projected into a file. Then, ``THROUGHLINE_SNAPSHOT_KILLS`` times (default 3) each:

- ``snapshot`` killed after a seeded random delay: its directory is either a whole snapshot (it finished
  first) or one that ``load-snapshot`` refuses with a typed error (exit 2), never creating the target;
- ``load-snapshot`` killed likewise: the target is either absent (run again from scratch) or a complete
  projection, never half a file; the leftover partial file is removed by the next run.

At the end the loaded file, caught up with turns produced after the snapshot, has the same tables
(``table_digests``) as a replay of the whole log. ``THROUGHLINE_SNAPSHOT_SEED`` replays a run.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import time
from pathlib import Path

import rel_support
from rel_support import Child, Workload, child_env, env_int

from throughline.producers.producer import TurnProducer
from throughline.projector.store import DuckProjection
from throughline.testing import create_topic

PARTITIONS = 3
RUN_TIMEOUT = 300.0


def _produce(bootstrap: str, topic: str, workload: Workload, count: int) -> None:
    projects = [f"/p/snap-{i}" for i in range(9)]
    with TurnProducer(bootstrap, topic, partitions=PARTITIONS) as producer:
        for i in range(count):
            producer.send(workload.next_turn(projects[i % len(projects)], body_bytes=2048))
        producer.flush(60.0)


def _digests(path: Path) -> dict[str, str]:
    with DuckProjection.open(path, read_only=True) as projection:
        return projection.table_digests()


def _run(folder: Path, env: dict[str, str], name: str, *argv: str) -> tuple[int, str, str]:
    child = Child(name, argv, folder, env).start()
    code = child.wait(RUN_TIMEOUT)
    return code, child.stdout(), child.stderr()


def _timed(folder: Path, env: dict[str, str], name: str, *argv: str) -> float:
    """Seconds one whole run of ``argv`` takes (it must succeed): the scale of the kill moments."""
    started = time.monotonic()
    code, _, err = _run(folder, env, name, *argv)
    assert code == 0, err
    return time.monotonic() - started


def _killed(folder: Path, env: dict[str, str], name: str, argv: list[str], delay: float) -> bool:
    """Run ``argv`` and SIGKILL it after ``delay`` seconds; ``True`` when the kill found it running."""
    child = Child(name, argv, folder, env).start()
    assert child.proc is not None
    try:
        child.proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:  # still running: the moment to kill it
        pass
    return child.sigkill()


def test_snapshot_and_load_killed_at_any_moment(kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path) -> None:
    seed = env_int("THROUGHLINE_SNAPSHOT_SEED", random.SystemRandom().randrange(1 << 30))
    kills = env_int("THROUGHLINE_SNAPSHOT_KILLS", 3)
    turns = env_int("THROUGHLINE_SNAPSHOT_TURNS", 6000)
    rng = random.Random(seed)
    topic = kafka_topic_name
    create_topic(kafka_bootstrap, topic, partitions=PARTITIONS, configs={"retention.ms": "-1", "retention.bytes": "-1"})
    workload = Workload(seed, projects=[], rollback_every=9, switch_every=7)
    _produce(kafka_bootstrap, topic, workload, turns)
    env = child_env()
    conn = ["--bootstrap-servers", kafka_bootstrap, "--topic", topic]
    source = tmp_path / "source.duckdb"
    code, _, err = _run(tmp_path, env, "project", "project", "--until-caught-up", *conn, "--db", str(source))
    assert code == 0, err

    # Whole runs first: how long each takes sets when the kills land (within its run, at random).
    cut = tmp_path / "cut"
    snapshot_s = _timed(tmp_path, env, "snapshot", "snapshot", "--db", str(source), "--out", str(cut))
    probe = tmp_path / "probe.duckdb"
    load_s = _timed(tmp_path, env, "probe", "load-snapshot", "--from", str(cut), *conn, "--db", str(probe))
    assert _digests(probe) == _digests(source)

    # The peer taking a snapshot, killed: a directory without its manifest is refused, the target not made.
    refused = whole = 0
    for k in range(kills):
        out = tmp_path / f"cut-killed-{k}"
        _killed(
            tmp_path,
            env,
            f"snapshot-{k}",
            ["snapshot", "--db", str(source), "--out", str(out)],
            rng.uniform(0.1, 1.0) * snapshot_s,
        )
        target = tmp_path / f"from-killed-{k}.duckdb"
        code, _, err = _run(
            tmp_path, env, f"load-killed-{k}", "load-snapshot", "--from", str(out), *conn, "--db", str(target)
        )
        if code == 0:
            whole += 1  # the snapshot finished before the kill
            assert _digests(target) == _digests(source)
        else:
            refused += 1
            assert code == 2, err
            error = json.loads(err.strip().splitlines()[-1])["error"]
            assert error["code"].startswith("projection_snapshot_"), error
            assert not target.exists()
        shutil.rmtree(out, ignore_errors=True)

    _produce(kafka_bootstrap, topic, workload, turns // 6)  # after the snapshot: caught up from its offsets

    # The new projection being built, killed: never half a file.
    loaded = tmp_path / "loaded.duckdb"
    load = ["load-snapshot", "--from", str(cut), *conn, "--db", str(loaded)]
    interrupted = 0
    for k in range(kills):
        if loaded.exists():
            break  # a kill came after the rename: the file is whole (checked below)
        interrupted += _killed(tmp_path, env, f"load-{k}", load, rng.uniform(0.1, 1.0) * load_s)
    if not loaded.exists():
        code, _, err = _run(tmp_path, env, "load", *load)
        assert code == 0, err
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("loaded.duckdb.") and "partial" in p.name]
    code, _, err = _run(tmp_path, env, "catch-up", "project", "--until-caught-up", *conn, "--db", str(loaded))
    assert code == 0, err

    replayed = tmp_path / "replayed.duckdb"
    code, _, err = _run(tmp_path, env, "replay", "replay", *conn, "--db", str(replayed))
    assert code == 0, err
    assert _digests(loaded) == _digests(replayed)
    rel_support.record(
        "snapshot",
        "kills",
        seed=seed,
        snapshot_kills=kills,
        refused=refused,
        whole=whole,
        load_kills=interrupted,
        lost=0,  # the loaded file's digests equal the replay's (asserted above)
        doubled=0,
    )
