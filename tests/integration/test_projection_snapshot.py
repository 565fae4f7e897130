"""Projection snapshots through a real broker (docs/operations.md "Projection snapshots", docs/scale-out.md
"Bootstrapping a new serve").

- ``throughline snapshot`` of a projected file, more turns produced after it, ``load-snapshot`` into a new
  file and ``project`` from the snapshot's offsets: the tables are identical (``table_digests``) to a
  replay of the whole log from offset 0; a snapshot of chosen partitions catches up the same way.
- A real ``serve`` hands a snapshot out at ``GET /v1/admin/snapshot`` (the admin token only); a second,
  new ``serve --bootstrap-from`` loads it, catches up from its offsets, and ends identical to a
  replay; a third, whose fetch is refused, logs why and catches up from offset 0 to the same tables.
"""

from __future__ import annotations

import io
import json
import random
import re
import tarfile
import time
from pathlib import Path

import pytest
from projector_env import cli, connection, history, produce_all
from test_serve import TOKEN, Serve, parse_metrics

from throughline.projector.store import DuckProjection
from throughline.testing import create_topic

PARTITIONS = 3


@pytest.fixture
def topic(kafka_bootstrap: str, kafka_topic_name: str) -> str:
    create_topic(
        kafka_bootstrap,
        kafka_topic_name,
        partitions=PARTITIONS,
        configs={"retention.ms": "-1", "retention.bytes": "-1"},
    )
    return kafka_topic_name


def _ok(*argv: str) -> dict[str, object]:
    code, out, err = cli(*argv)
    assert code == 0, err
    return dict(json.loads(out))


def _digests(path: Path) -> dict[str, str]:
    with DuckProjection.open(path, read_only=True) as projection:
        return projection.table_digests()


def test_snapshot_load_and_catch_up_equals_a_replay(kafka_bootstrap: str, topic: str, tmp_path: Path) -> None:
    records = history(random.Random(45), 900, projects=9)
    produce_all(kafka_bootstrap, topic, PARTITIONS, records[:600])
    source = tmp_path / "source.duckdb"
    _ok("project", "--until-caught-up", *connection(kafka_bootstrap, topic, source))
    whole = _ok("snapshot", "--db", str(source), "--out", str(tmp_path / "cut"))
    assert sum(int(v) for v in whole["nextOffsets"].values()) == 600  # type: ignore[union-attr]
    some = _ok("snapshot", "--db", str(source), "--out", str(tmp_path / "cut02"), "--partitions", "0,2")
    assert some["partitions"] == [0, 2]
    produce_all(kafka_bootstrap, topic, PARTITIONS, records[600:])  # after the snapshot

    replayed = tmp_path / "replayed.duckdb"
    _ok("replay", *connection(kafka_bootstrap, topic, replayed))
    for cut, name in ((tmp_path / "cut", "loaded.duckdb"), (tmp_path / "cut02", "loaded02.duckdb")):
        loaded = tmp_path / name
        _ok("load-snapshot", "--from", str(cut), *connection(kafka_bootstrap, topic, loaded))
        caught_up = _ok("project", "--until-caught-up", *connection(kafka_bootstrap, topic, loaded))
        if name == "loaded.duckdb":
            assert caught_up["records"] == 300  # only what came after the snapshot
        assert _digests(loaded) == _digests(replayed), name

    # Refused against this log: another topic name; a target that exists.
    code, _, err = cli("load-snapshot", "--from", str(tmp_path / "cut"), *connection(kafka_bootstrap, topic, replayed))
    assert code == 2 and json.loads(err.splitlines()[-1])["error"]["code"] == "projection_snapshot_target_exists"
    other = topic + "-other"
    create_topic(kafka_bootstrap, other, partitions=PARTITIONS)
    code, _, err = cli(
        "load-snapshot", "--from", str(tmp_path / "cut"), *connection(kafka_bootstrap, other, tmp_path / "o.duckdb")
    )
    assert code == 2 and json.loads(err.splitlines()[-1])["error"]["code"] == "projection_snapshot_log_mismatch"
    assert not (tmp_path / "o.duckdb").exists()


def _records_committed(serve: Serve) -> float:
    """``throughline_projector_records_total``: records the serve's projector consumed and committed."""
    samples = parse_metrics(serve.metrics(TOKEN))
    return samples[("throughline_projector_records_total", frozenset())]


def test_serve_hands_out_a_snapshot_and_a_new_serve_bootstraps_from_it(
    kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    records = history(random.Random(46), 700, projects=9)
    produce_all(kafka_bootstrap, topic, PARTITIONS, records[:500])
    auth = {"THROUGHLINE_AUTH_TOKEN": TOKEN}
    peer = Serve(kafka_bootstrap, topic, tmp_path / "peer.duckdb", env=auth).start()
    try:
        peer.wait_caught_up(500)
        status, _, _ = peer.request("GET", "/v1/admin/snapshot")
        assert status == 401
        status, headers, payload = peer.request("GET", "/v1/admin/snapshot?partitions=1", token=TOKEN)
        assert status == 200 and headers["content-type"] == "application/x-tar"
        with tarfile.open(fileobj=io.BytesIO(payload)) as tar:
            names = sorted(tar.getnames())
            manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
        assert "manifest.json" in names and "turns.parquet" in names and manifest["partitions"] == [1]
        status, _, payload = peer.request("GET", "/v1/admin/snapshot?partitions=7", token=TOKEN)
        assert status == 400 and json.loads(payload)["error"]["code"] == "projection_snapshot_partitions"
        assert not [p for p in tmp_path.iterdir() if ".snapshot-" in p.name]  # temporary files removed

        fresh = Serve(kafka_bootstrap, topic, tmp_path / "fresh.duckdb", "--bootstrap-from", peer.url, env=auth)
        fresh.start()  # the peer holds the 500 turns: the snapshot it hands out is of offsets summing to 500
        try:
            produce_all(kafka_bootstrap, topic, PARTITIONS, records[500:])  # after the snapshot
            fresh.wait_caught_up(700)
            # Every record before the snapshot came with it: the projector consumes only the 200 after it.
            # (Reads see a poll before its commit; the counter counts commits: wait for them, bounded.)
            deadline = time.monotonic() + 60
            while _records_committed(fresh) < 200 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _records_committed(fresh) == 200
        finally:
            assert fresh.terminate() == 0
        loaded = re.search(r"loaded partitions \[0, 1, 2\] at offsets (\{[^}]*\})", fresh.stderr())
        assert loaded, fresh.stderr()
        assert sum(int(o) for o in re.findall(r": (\d+)", loaded.group(1))) == 500

        # A fetch the peer refuses (no token): logged, and the new serve catches up from offset 0.
        refused = Serve(kafka_bootstrap, topic, tmp_path / "refused.duckdb", "--bootstrap-from", peer.url)
        refused.start()
        try:
            refused.wait_caught_up(700)
            deadline = time.monotonic() + 60
            while _records_committed(refused) < 700 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _records_committed(refused) == 700  # from offset 0
        finally:
            assert refused.terminate() == 0
        assert "snapshot_fetch_failed" in refused.stderr() and "offset 0" in refused.stderr()
    finally:
        assert peer.terminate() == 0
    replayed = tmp_path / "replayed.duckdb"
    _ok("replay", *connection(kafka_bootstrap, topic, replayed))
    expected = _digests(replayed)
    assert _digests(tmp_path / "fresh.duckdb") == expected
    assert _digests(tmp_path / "refused.duckdb") == expected
    assert _digests(tmp_path / "peer.duckdb") == expected
