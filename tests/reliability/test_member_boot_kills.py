"""A joining group member killed during its bootstrap from a peer (docs/reliability.md, "A joining member
killed during its bootstrap"; docs/scale-out.md "A member joins: bootstrap from a peer").

One real broker; a topic of 2 partitions holding ``THROUGHLINE_MEMBER_BOOT_TURNS`` turns (default 6,000,
2 KB bodies, switches and rollbacks). Member A (``serve --group``) projects it alone, behind a loopback
proxy that can hold its snapshot answers back. Member B, with an empty file, joins and is SIGKILLed:

1. during a download (A's answer held back by the proxy): its download directory is left beside its file,
   nothing of that partition is in the file;
2. then, ``THROUGHLINE_MEMBER_BOOT_KILLS`` times (default 3) at most, restarted and SIGKILLed as soon as it
   logs that it loads a snapshot into its file (the load is one transaction: the partition is all there
   or not at all).

After every kill B's file must equal the fold of exactly the log prefix its applied offsets name,
partition by partition (nothing lost, doubled or stale). Then B is restarted for good: it goes live on
everything, catches up with turns produced after the kills, removes the download left by the first
kill, and its file, like A's, equals the fold of the whole log. At least one kill must land inside a load
(the partition not committed). ``THROUGHLINE_MEMBER_BOOT_SEED`` replays a run's turns.
"""

from __future__ import annotations

import random
import re
import time
from pathlib import Path

import pytest
import rel_support
import test_kill_matrix as km
from rel_support import Child, Workload, check_applied_prefix, check_projection, child_env, env_int, wait_until
from support.slow_proxy import SlowSnapshotProxy
from support.topic import read_topic_and_ends
from test_kill_matrix_group import _group, _settled

from throughline.producers.producer import TurnProducer
from throughline.testing import create_topic
from throughline.testing.kafka import free_port

pytestmark = pytest.mark.integration

PARTITIONS = 2
SESSION_TIMEOUT_MS = 6000
MAX_POLL_INTERVAL_MS = 10_000
DEADLINE = 180.0
LOADING = re.compile(r"member bootstrap of partition (\d+): loading the snapshot from")


def _produce(bootstrap: str, topic: str, workload: Workload, count: int, first: int = 0) -> None:
    projects = [f"/p/member-boot-{i}" for i in range(8)]
    with TurnProducer(bootstrap, topic, partitions=PARTITIONS) as producer:
        for i in range(first, first + count):
            producer.send(workload.next_turn(projects[i % len(projects)], body_bytes=2048))
        producer.flush(60.0)


def _serve(name: str, port: int, db: Path, url: str, folder: Path, env: dict[str, str]) -> Child:
    argv = ["serve", "--host", "127.0.0.1", "--port", str(port), "--db", str(db), "--read-wait", "2"]
    return Child(name, [*argv, "--advertise", url], folder, env)


def _downloads(db: Path) -> list[Path]:
    """The member's snapshot downloads under way (or left by a kill), beside its file."""
    return sorted(db.parent.glob(f".{db.name}.member-boot-*"))


def _first_load(child: Child, timeout: float) -> int | None:
    """The partition of the first snapshot load ``child``'s run logs, as soon as it logs it (its stderr
    read every 2 ms, bounded in time); ``None`` when it logs none in time or ends."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and child.alive():
        found = LOADING.search(child.stderr(limit=1 << 20))
        if found:
            return int(found.group(1))
        time.sleep(0.002)
    return None


def test_a_joining_member_killed_during_its_download_and_its_load(
    kafka_bootstrap: str, kafka_topic_name: str, kafka_group_id: str, tmp_path: Path
) -> None:
    seed = env_int("THROUGHLINE_MEMBER_BOOT_SEED", random.SystemRandom().randrange(1 << 30))
    turns = env_int("THROUGHLINE_MEMBER_BOOT_TURNS", 6000)
    load_kills = env_int("THROUGHLINE_MEMBER_BOOT_KILLS", 3)
    print(f"\nmember boot kills: seed {seed}, {turns} turns, up to {load_kills} kills during a load")
    topic = kafka_topic_name
    create_topic(kafka_bootstrap, topic, partitions=PARTITIONS, configs={"retention.ms": "-1", "retention.bytes": "-1"})
    workload = Workload(seed, projects=[], rollback_every=9, switch_every=7)
    _produce(kafka_bootstrap, topic, workload, turns)
    env = child_env(
        THROUGHLINE_BOOTSTRAP_SERVERS=kafka_bootstrap,
        THROUGHLINE_TOPIC=topic,
        THROUGHLINE_TOKEN_KEY=km.KEY_HEX,
        THROUGHLINE_GROUP=kafka_group_id,
        THROUGHLINE_GROUP_SESSION_TIMEOUT_MS=str(SESSION_TIMEOUT_MS),
        THROUGHLINE_GROUP_MAX_POLL_INTERVAL_MS=str(MAX_POLL_INTERVAL_MS),
    )
    a_port, b_port = free_port(), free_port()
    a_db, b_db = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    mid_load = after_commit = 0
    prefix_checks = 0
    started = time.monotonic()
    with SlowSnapshotProxy(a_port, delay=DEADLINE, slow=0) as proxy:
        urls = [proxy.url, f"http://127.0.0.1:{b_port}"]  # A advertises the proxy
        a = _serve("a", a_port, a_db, urls[0], tmp_path, env)
        b = _serve("b", b_port, b_db, urls[1], tmp_path, env)
        try:
            a.start()
            wait_until(lambda: _settled(urls[:1]), timeout=DEADLINE, what="A alone, live on everything")

            # 1. B killed during a download: A's answer is held back until then.
            proxy.slow_next(1)
            b.start()
            wait_until(proxy.holding, timeout=DEADLINE, what="B downloading a snapshot A holds back")
            slow = int(proxy.holding()[0].rsplit("=", 1)[1])
            assert _downloads(b_db), "no download directory beside B's file"
            assert b.sigkill()
            proxy.release.set()
            applied = check_applied_prefix(kafka_bootstrap, topic, b_db, PARTITIONS, missing_ok=True)
            prefix_checks += 1
            assert applied.get(slow, 0) == 0, applied  # nothing of the partition whose download was cut

            # 2. B killed as soon as it loads a snapshot into its file.
            for _ in range(load_kills):
                if all(applied.get(p, 0) > 0 for p in range(PARTITIONS)):
                    break  # everything loaded already: nothing left to boot
                b.start()
                loading = _first_load(b, DEADLINE)
                assert loading is not None, f"B logged no load:\n{b.stderr()}"
                assert b.sigkill()
                applied = check_applied_prefix(kafka_bootstrap, topic, b_db, PARTITIONS, missing_ok=True)
                prefix_checks += 1
                if applied.get(loading, 0) == 0:
                    mid_load += 1  # the load's transaction never committed: none of the partition is there
                else:
                    after_commit += 1

            # 3. B restarted for good: live on everything, then caught up with turns produced after.
            b.start()
            wait_until(lambda: _settled(urls), timeout=DEADLINE, what="A and B settled, live on everything")
            _produce(kafka_bootstrap, topic, workload, turns // 10, first=turns)
            wait_until(lambda: _settled(urls), timeout=DEADLINE, what="A and B caught up with the later turns")
            held = (_group(urls[1]) or {}).get("held")
            assert sorted(held or []) == list(range(PARTITIONS)), held  # two members, two copies: B holds all
            assert not _downloads(b_db), "the download left by the killed member is still there"
            assert b.terminate() == 0, b.stderr()
            assert a.terminate() == 0, a.stderr()
        finally:
            b.stop_quietly()
            a.stop_quietly()

    stored, ends = read_topic_and_ends(kafka_bootstrap, topic)
    fold = rel_support.fold_log(stored, PARTITIONS)
    assert not {t: w for t, w in fold.by_turn_id.items() if len(w) > 1}, "a turn is in the log twice"
    compared = check_projection(b_db, fold, ends, topic=topic)  # nothing lost, doubled or stale
    check_projection(a_db, fold, ends, topic=topic)
    b_logs = "".join(p.read_text(errors="replace") for p in sorted(tmp_path.glob("b.*.err")))
    took = time.monotonic() - started
    print(
        f"member boot kills: 1 during a download, {mid_load} during a load, {after_commit} after a load's "
        f"commit; B's file: {compared}; {took:.0f} s"
    )
    rel_support.record(
        "kill",
        "member_boot",
        seed=seed,
        kills=1 + mid_load + after_commit,
        download_kills=1,
        load_kills=mid_load,
        after_commit=after_commit,
        prefix_checks=prefix_checks,
        records=len(stored),
        lost=0,
        doubled=0,
        seconds=round(took),
    )
    assert "loaded partition" in b_logs  # B did boot from A's snapshots (not only from the log)
    assert mid_load >= 1, f"no kill landed inside a load ({after_commit} after its commit)"
