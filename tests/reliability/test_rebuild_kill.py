"""SIGKILL ``serve`` during a rebuild without downtime and during its switch (docs/reliability.md).

One real broker and one topic. For each step of a rebuild (``rebuild_kill/sitecustomize.py``: while the new
file replays; the live projector paused; the marker written; reads switched; the old file removed), a
``serve`` projects the topic while turns are produced, is asked to rebuild, and its whole process group is
SIGKILLed at that step. Then:

- the file a start keeps is the one the marker names (the old one before the marker, the new one after),
  and it equals the fold of exactly the log prefix its applied offsets name (never half of a file);
- a restarted ``serve`` (no fault) removes the leftover (an unfinished new file, or the old file and the
  marker), serves from ``--db``, answers reads ``ok`` and catches up without its offsets going back;
- after a clean stop ``--db`` equals a fresh replay of the whole log: nothing lost, doubled or stale.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rel_support
from rel_support import Child, check_applied_prefix, child_env, http_json, wait_until

from throughline.producers.producer import TurnProducer
from throughline.projector.rebuild_files import RebuildFiles
from throughline.projector.runner import Projector
from throughline.projector.store import DuckProjection

pytestmark = pytest.mark.integration

PARTITIONS = 3
KEY_HEX = "7c" * 32
PROJECTS = [f"/srv/rebuild-kill/p{i}" for i in range(4)]
FAULTS = Path(__file__).resolve().parent / "rebuild_kill"
BEFORE_MARKER = ("replaying", "paused")
STEPS = (*BEFORE_MARKER, "marked", "switched", "removed")
TIMEOUT = 120.0


def _turn(n: int, thread: str) -> dict[str, Any]:
    return {
        "project": PROJECTS[n % len(PROJECTS)],
        "host": "host-k",
        "thread": thread,
        "turn_id": f"{thread}-{n}",
        "completed_at": rel_support.BASE_MICROS + n,
        "body": f"turn {n} of {thread}",
    }


@pytest.fixture(scope="module")
def topic(kafka_bootstrap: str) -> Iterator[str]:
    name = f"t-rebuild-kill-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    with TurnProducer(kafka_bootstrap, name, partitions=PARTITIONS) as producer:
        for n in range(3000):
            producer.append(**_turn(n, "history"))
    yield name


def _serve(bootstrap: str, topic: str, db: Path, folder: Path, **extra: str) -> tuple[Child, str]:
    env = child_env(
        THROUGHLINE_BOOTSTRAP_SERVERS=bootstrap,
        THROUGHLINE_TOPIC=topic,
        THROUGHLINE_DB=str(db),
        THROUGHLINE_TOKEN_KEY=KEY_HEX,
        **extra,
    )
    child = Child("serve", ["serve", "--port", "0", "--log-level", "info"], folder, env).start()
    url = wait_until(
        lambda: child.stdout().strip() or (not child.alive() and "dead"), timeout=TIMEOUT, what="serve's URL"
    )
    assert url.startswith("http://"), child.stderr()
    return child, url


def _caught_up(url: str) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        status, report = http_json(url + "/readyz")
        return report if status == 200 and report["lag"] == 0 else None

    return dict(wait_until(ready, timeout=TIMEOUT, what="serve to catch up"))


def _produce(bootstrap: str, topic: str, thread: str, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        with TurnProducer(bootstrap, topic, partitions=PARTITIONS) as producer:
            for n in range(20_000):
                if stop.wait(0.005):
                    return
                producer.append(**_turn(n, thread))

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    return runner


@pytest.mark.parametrize("step", STEPS)
def test_serve_killed_during_a_rebuild_restarts_on_one_whole_file(
    kafka_bootstrap: str, topic: str, tmp_path: Path, step: str
) -> None:
    db = tmp_path / "projection.duckdb"
    files = RebuildFiles(db)
    stop = threading.Event()
    producer = _produce(kafka_bootstrap, topic, f"live-{step}", stop)
    victim, url = _serve(
        kafka_bootstrap,
        topic,
        db,
        tmp_path,
        THROUGHLINE_TEST_KILL_AT_REBUILD=step,
        PYTHONPATH=os.pathsep.join(p for p in (str(FAULTS), os.environ.get("PYTHONPATH", "")) if p),
    )
    try:
        _caught_up(url)
        status, document = http_json(url + "/v1/admin/rebuild", data=b"{}")
        assert status == 202, document
        code = victim.wait(TIMEOUT)  # the injected SIGKILL of its own process group
    finally:
        victim.stop_quietly()
    assert code == -9, victim.stderr()
    stop.set()
    producer.join(60)

    # The file a start keeps is whole: the fold of exactly the prefix its offsets name.
    assert files.switched() == (step not in BEFORE_MARKER)
    kept = files.rebuilt if files.switched() else db
    assert kept.exists()
    before = check_applied_prefix(kafka_bootstrap, topic, kept, PARTITIONS)

    serve, url = _serve(kafka_bootstrap, topic, db, tmp_path)
    try:
        report = _caught_up(url)
        assert not files.switched() and not files.rebuilt.exists() and db.exists()  # the leftover went
        assert not Path(str(files.rebuilt) + ".wal").exists()
        after = {p["partition"]: p["appliedOffset"] for p in report["partitions"]}
        assert all(after[p] >= o for p, o in before.items())  # never back to a staler file
        status, page = http_json(url + f"/v1/projects/read?project={PROJECTS[0]}&limit=3")
        assert status == 200 and page["status"] == "ok", page
    finally:
        assert serve.terminate() == 0, serve.stderr()

    fresh = tmp_path / "fresh.duckdb"
    with DuckProjection.open(fresh, topic=topic) as replayed:
        assert Projector(replayed, kafka_bootstrap, topic).run(until_caught_up=True).caught_up
        expected = replayed.table_digests()
        turns = replayed.stats().turns
    with DuckProjection.open(db, read_only=True, topic=topic) as served:
        assert served.table_digests() == expected  # nothing lost, doubled or stale
        assert served.stats().turns == turns
    rel_support.record(
        "rebuild",
        f"serve killed at {step}",
        kills=1,
        restarts=1,
        lost=0,
        doubled=0,
        kept="new" if step not in BEFORE_MARKER else "old",
        leftover_removed=True,
    )
    json.dumps(rel_support.REPORT)  # the report stays serialisable
