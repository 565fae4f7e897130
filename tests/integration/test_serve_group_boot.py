"""A ``serve --group`` member that joins bootstraps its partitions from a peer's projection snapshot, on a
real broker with real ``serve`` processes (docs/scale-out.md "A member joins: bootstrap from a peer").

Member A runs alone and projects everything; member B joins (copies 2: B gains all six partitions, A
still holds them) and loads each from A's snapshot instead of replaying it, logs it, goes live, and ends
with the same tables as a replay of the log; reads against both stay ``ok`` while B joins. A third
member C, whose token A refuses, logs the refusal with its code and catches up from the log instead,
to the log's fold.

A slow holder (its snapshot answer held back by a proxy longer than the group's shortened max poll
interval) does not make the joining member leave the group: it downloads off its poll loop, goes live on
its other partitions meanwhile (forwarding reads of the slow one to the holder), and ends with exactly
the log's turns, in the generation it joined.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

from projector_env import cli, connection
from support.slow_proxy import SlowSnapshotProxy
from support.topic import read_topic_and_ends
from test_serve_group import (
    PARTITIONS,
    PROJECTS,
    Ingest,
    Member,
    _assert_file_is_the_fold,
    _head_seq,
    _serves_everything,
    _settled,
    _wait,
)

from throughline.projector.store import DuckProjection

LOADED = re.compile(r"member bootstrap: loaded partition (\d+) from (\S+) at offset (\d+)")
DOWNLOADED = re.compile(
    r"member bootstrap: loaded partition (\d+) from \S+ at offset \d+ in \S+ \(download ([\d.]+)s\)"
)
#: Shortened for the slow-holder test (the broker's minimum session timeout is 6 s).
MAX_POLL_INTERVAL_MS = 8000
#: How long the slow holder holds its first snapshot answer back: well past the max poll interval.
SLOW_S = 25.0


def _digests(path: Path) -> dict[str, str]:
    with DuckProjection.open(path, read_only=True) as projection:
        return projection.table_digests()


def test_a_joining_member_loads_its_partitions_from_a_peer_and_falls_back_when_refused(
    kafka_bootstrap: str, kafka_topic_name: str, kafka_group_id: str, tmp_path: Path
) -> None:
    topic = kafka_topic_name
    ingest = Ingest(kafka_bootstrap, topic)
    members: list[Member] = []
    reads: list[tuple[str, int | None]] = []
    stop_reading = threading.Event()
    try:
        for _ in range(5):
            ingest.round()
        a = Member(kafka_bootstrap, topic, tmp_path / "a.duckdb", kafka_group_id)
        members.append(a.start())
        _wait("member A alone, live on everything", lambda: _settled([a]))
        _wait("A serving every project", lambda: _serves_everything([a], ingest.counts))
        expected = dict(ingest.counts)

        b = Member(kafka_bootstrap, topic, tmp_path / "b.duckdb", kafka_group_id)

        def read_throughout() -> None:
            for i in range(100_000):  # bounded in count and in time (the event)
                if stop_reading.is_set():
                    return
                project = PROJECTS[i % len(PROJECTS)]
                for m in (a, b) if b.url else (a,):
                    reads.append((f"{m.db.name} {project}", _head_seq(m, project)))
                time.sleep(0.05)

        reader = threading.Thread(target=read_throughout, daemon=True)
        reader.start()
        members.append(b.start())
        took = _wait("A and B in one generation, each live on what it holds", lambda: _settled([a, b]))
        print(f"\nB joined and went live in {took:.1f} s")
        time.sleep(1.0)
        stop_reading.set()
        reader.join(30.0)
        assert not reader.is_alive()
        bad = [(who, got) for who, got in reads if got != expected[who.split(" ", 1)[1]]]
        assert reads and bad == [], bad[:5]  # every read during the join was ok, with every turn

        loaded = {int(m.group(1)): (m.group(2), int(m.group(3))) for m in LOADED.finditer(b.stderr_path.read_text())}
        held = b.readyz()["group"]["held"]
        assert sorted(held) == list(range(PARTITIONS)), held  # copies 2 over two members: B holds all six
        assert sorted(loaded) == sorted(held), b.stderr()  # each from a snapshot, none replayed
        assert all(url == a.advertised and offset > 0 for url, offset in loaded.values()), loaded

        ingest.round()  # B catches up from the snapshot's offsets past it
        _wait("A and B serving the last round", lambda: _serves_everything([a, b], ingest.counts))

        # C's token is refused by A's snapshot endpoint: C catches up from the log.
        c = Member(kafka_bootstrap, topic, tmp_path / "c.duckdb", kafka_group_id)
        c.env["THROUGHLINE_BOOTSTRAP_TOKEN"] = "not-the-admin-token-0123456789"
        members.append(c.start())
        _wait("A, B and C in one generation, each live", lambda: _settled([a, b, c]))
        c_log = c.stderr_path.read_text()
        assert "refused (snapshot_fetch_failed" in c_log and not LOADED.search(c_log), c.stderr()
        _wait("all three serving every project", lambda: _serves_everything([a, b, c], ingest.counts))
    finally:
        stop_reading.set()
        ingest.producer.close()
        for m in members:
            if m.proc is not None and m.proc.poll() is None:
                assert m.terminate() == 0, m.stderr()
        for m in members:
            m.kill()

    records, _ = read_topic_and_ends(kafka_bootstrap, topic)
    replayed = tmp_path / "replayed.duckdb"
    code, out, err = cli("replay", *connection(kafka_bootstrap, topic, replayed))
    assert code == 0, err
    assert json.loads(out)
    assert _digests(b.db) == _digests(replayed)  # B holds every partition to the end: exactly a replay
    for m in (a, b):
        _assert_file_is_the_fold(m.db, records)
    assert _assert_file_is_the_fold(c.db, records) != {}, "C applied nothing"  # from the log: still the fold


def _group(m: Member) -> dict[str, Any]:
    try:
        return dict(m.readyz().get("group") or {})
    except (OSError, ValueError):
        return {}


def _generation(members: list[Member]) -> int | None:
    """The generation every one of ``members`` is in, when they are all in one of exactly them."""
    groups = [_group(m) for m in members]
    if not all(g.get("joined") and g.get("members") for g in groups):
        return None
    urls = {m.advertised for m in members}
    if len({g["generation"] for g in groups}) != 1 or any({x["url"] for x in g["members"]} != urls for g in groups):
        return None
    return int(groups[0]["generation"])


def test_a_slow_holder_does_not_make_the_joining_member_leave_the_group(
    kafka_bootstrap: str, kafka_topic_name: str, kafka_group_id: str, tmp_path: Path
) -> None:
    topic = kafka_topic_name
    ingest = Ingest(kafka_bootstrap, topic)
    members: list[Member] = []
    a = Member(kafka_bootstrap, topic, tmp_path / "a.duckdb", kafka_group_id)
    b = Member(kafka_bootstrap, topic, tmp_path / "b.duckdb", kafka_group_id)
    # A advertises the proxy: B downloads A's snapshots (and forwards reads to A) through it.
    proxy = SlowSnapshotProxy(int(urllib.parse.urlsplit(a.advertised).port or 0), delay=SLOW_S)
    a.advertised = proxy.url
    a.args[-1] = proxy.url
    for m in (a, b):
        m.env["THROUGHLINE_GROUP_MAX_POLL_INTERVAL_MS"] = str(MAX_POLL_INTERVAL_MS)
    try:
        for _ in range(3):
            ingest.round()
        members.append(a.start())
        _wait("member A alone, live on everything", lambda: _settled([a]))
        members.append(b.start())
        joined = _wait_for("A and B in one generation", lambda: _generation([a, b]))
        _wait("B downloading a snapshot A holds back", lambda: bool(proxy.holding()))
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(proxy.holding()[0]).query)
        slow = int(query["partitions"][0])
        ingest.round()  # new turns on every partition while that download hangs
        others = [p for p in range(PARTITIONS) if p != slow]

        def live_on_the_others() -> bool:
            g = _group(b)
            return g.get("catchingUp") == [slow] and sorted(g.get("held") or []) == list(range(PARTITIONS))

        took = _wait("B live on every partition but the slow one", live_on_the_others, timeout=SLOW_S)
        # Reads of every project are answered with every turn, the slow partition's by forwarding to A.
        _wait("B serving every project meanwhile", lambda: _serves_everything([b], ingest.counts), timeout=SLOW_S)
        assert proxy.holding(), "the slow download ended before B went live on its other partitions"
        assert _generation([a, b]) == joined  # nobody left or joined while B downloads
        print(f"\nB live on {others} {took:.1f} s into the download of partition {slow}")

        _wait("A and B settled, B live on everything", lambda: _settled([a, b]))
        assert _generation([a, b]) == joined, b.stderr()  # B never left the group: no rebalance since it joined
        b_log = b.stderr_path.read_text()
        assert "poll timeout has expired" not in b_log, b.stderr()
        downloads = {int(m.group(1)): float(m.group(2)) for m in DOWNLOADED.finditer(b_log)}
        assert sorted(downloads) == list(range(PARTITIONS)), b.stderr()  # every partition from a snapshot
        assert downloads[slow] >= MAX_POLL_INTERVAL_MS / 1000, downloads  # longer than a member may go unpolled
        assert proxy.slowed and len(proxy.slowed) == 1, proxy.slowed

        ingest.round()
        _wait("A and B serving the last round", lambda: _serves_everything([a, b], ingest.counts))
    finally:
        ingest.producer.close()
        proxy.close()
        for m in members:
            if m.proc is not None and m.proc.poll() is None:
                assert m.terminate() == 0, m.stderr()
        for m in members:
            m.kill()

    records, _ = read_topic_and_ends(kafka_bootstrap, topic)
    replayed = tmp_path / "replayed.duckdb"
    code, _, err = cli("replay", *connection(kafka_bootstrap, topic, replayed))
    assert code == 0, err
    assert _digests(b.db) == _digests(replayed)  # B holds every partition to the end: exactly a replay
    for m in (a, b):
        _assert_file_is_the_fold(m.db, records)


def _wait_for(what: str, value: Any, timeout: float = 120.0) -> Any:
    """``value()`` once it is not ``None`` (bounded in time)."""
    found: list[Any] = []
    _wait(what, lambda: found.append(value()) or found[-1] is not None, timeout)
    return found[-1]
