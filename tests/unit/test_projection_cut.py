"""Projection snapshots without a broker (``projector/cut_manifest.py``, ``projector/store/cut_files.py``,
``projector/cut_load.py``): the cut of a projection loads into a file with identical tables; cuts of
chosen partitions hold exactly those partitions' rows; a cut taken while the projector commits is one
commit's state (loading it and applying the rest of the log gives the full projection); the manifest's
format is pinned (a golden file); each refusal has its own error.

The integration tier (tests/integration/test_projection_snapshot.py) does the same through a real broker,
the ``snapshot`` command and ``serve``.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from projector_histories import TOPIC, place, to_log, turn

from throughline.projector.cut_load import PARTIAL_SUFFIX, check_against_log, load_cut_into, take_cut, verify_cut
from throughline.projector.cut_manifest import (
    CUT_TABLES,
    FORMAT,
    MANIFEST,
    file_sha256,
    manifest_from_json,
    parse_partitions,
    read_manifest,
)
from throughline.projector.exceptions import (
    ProjectionSnapshotError,
    SnapshotAheadOfLogError,
    SnapshotDamagedError,
    SnapshotLogMismatchError,
    SnapshotPartitionsError,
    SnapshotTargetError,
    SnapshotVersionError,
)
from throughline.projector.store import DuckProjection, LogRecord, cut_files
from throughline.projector.store.cut_files import load_cut

PARTITIONS = 4
TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"
GOLDEN = Path(__file__).parent / "golden" / "projection_snapshot_manifest.json"


def _history(seed: int, size: int) -> list[LogRecord]:
    """Turns of 24 projects over ``PARTITIONS`` partitions with appends, retries, rewinds and gaps, plus a
    poison record on partition 1 (a quarantine row without a project)."""
    rng = random.Random(seed)
    lengths: dict[tuple[str, str], int] = {}
    records = []
    for i in range(size):
        project, thread = f"/work/p{rng.randrange(24)}", f"t{rng.randrange(2)}"
        n = lengths.get((project, thread), 0)
        roll = rng.random()
        if records and roll < 0.05:
            records.append(records[rng.randrange(len(records))])  # a retry
            continue
        seq = rng.randint(1, n) if n and roll < 0.12 else (n + 2 if roll < 0.14 else n + 1)
        records.append(turn(project, "host-a", thread, f"u{i}", seq=seq, body=f"body {i}"))
        if seq <= n + 1:
            lengths[(project, thread)] = seq
    log = to_log(place(records, PARTITIONS))
    ends = {p: sum(1 for r in log if r.partition == p) for p in range(PARTITIONS)}
    log.append(LogRecord(1, ends[1], b"k", b"not avro"))
    return log


def _apply(
    projection: DuckProjection, log: list[LogRecord], start: dict[int, int] | None = None, batch: int = 7
) -> None:
    for p in range(PARTITIONS):
        recs = [r for r in log if r.partition == p and r.offset >= (start or {}).get(p, 0)]
        for i in range(0, len(recs), batch):
            projection.apply_batch(TOPIC, p, recs[i : i + batch])


def _projection(path: Path, log: list[LogRecord]) -> DuckProjection:
    projection = DuckProjection.open(path, topic=TOPIC)
    projection.bind_log(TOPIC, TOPIC_ID, PARTITIONS)
    _apply(projection, log)
    return projection


@pytest.fixture
def full(tmp_path: Path) -> Iterator[DuckProjection]:
    with _projection(tmp_path / "full.duckdb", _history(5, 400)) as projection:
        yield projection


def _load(tmp_path: Path, cut: Path, name: str) -> Path:
    path = tmp_path / name
    load_cut(path, cut, verify_cut(cut))
    return path


def test_a_whole_cut_loads_into_identical_tables(full: DuckProjection, tmp_path: Path) -> None:
    manifest = take_cut(full, tmp_path / "cut")
    assert manifest.partitions == (0, 1, 2, 3) and manifest.topic_id == TOPIC_ID
    assert manifest.next_offsets() == full.applied_offsets()
    loaded = _load(tmp_path, tmp_path / "cut", "loaded.duckdb")
    with DuckProjection.open(loaded, read_only=True) as copy:
        assert copy.table_digests() == full.table_digests()
        assert (copy.topic, copy.topic_id, copy.partitions) == (TOPIC, TOPIC_ID, PARTITIONS)
    assert sum(manifest.tables[t].rows for t in CUT_TABLES) > 400
    assert manifest.tables["quarantine"].rows > 0 and manifest.tables["superseded_turns"].rows > 0


def _rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    with DuckProjection.open(path, read_only=True) as projection:
        return {t: [tuple(r.values()) for r in projection.table_rows(t)] for t in CUT_TABLES}


def test_cuts_of_chosen_partitions_hold_exactly_their_rows(full: DuckProjection, tmp_path: Path) -> None:
    take_cut(full, tmp_path / "all")
    whole = _rows(_load(tmp_path, tmp_path / "all", "all.duckdb"))
    parts: list[dict[str, list[tuple[Any, ...]]]] = []
    for chosen in ((0, 2), (1,), (3,)):
        manifest = take_cut(full, tmp_path / f"cut{chosen}", chosen)
        assert manifest.partitions == chosen
        assert set(manifest.offsets) == set(chosen)
        parts.append(_rows(_load(tmp_path, tmp_path / f"cut{chosen}", f"p{chosen}.duckdb")))
        turns = parts[-1]["turns"]
        assert turns and {r[10] for r in turns} <= set(chosen)  # log_partition
    for table in CUT_TABLES:
        union = sorted(row for part in parts for row in part[table])
        assert union == sorted(whole[table]), table  # none lost, none in two partitions' cuts


def test_a_cut_taken_while_the_projector_commits_is_one_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = _history(9, 1500)
    with _projection(tmp_path / "reference.duckdb", log) as reference:
        expected = reference.table_digests()
    live = DuckProjection.open(tmp_path / "live.duckdb", topic=TOPIC)
    live.bind_log(TOPIC, TOPIC_ID, PARTITIONS)
    writer = threading.Thread(target=_apply, args=(live, log), kwargs={"batch": 3})
    # Midway through the cut (before its turns file), hold it until the writer committed 50 more records:
    # the cut's open transaction must not stop the projector's commits (it takes no lock they wait for).
    commits_during_cut: list[int] = []
    name_of = cut_files.table_file

    def held(table: str) -> str:
        if table == "turns" and not commits_during_cut:
            before = sum(live.applied_offsets().values())
            for _ in range(2000):  # bounded: 20 s
                if sum(live.applied_offsets().values()) >= before + 50 or not writer.is_alive():
                    break
                time.sleep(0.01)
            commits_during_cut.append(sum(live.applied_offsets().values()) - before)
        return name_of(table)

    monkeypatch.setattr(cut_files, "table_file", held)
    with live:
        writer.start()
        try:
            for _ in range(2000):  # until the writer is well under way (bounded: 20 s)
                if sum(live.applied_offsets().values()) > 300 or not writer.is_alive():
                    break
                time.sleep(0.01)
            manifest = take_cut(live, tmp_path / "cut")
        finally:
            writer.join(120)
        assert not writer.is_alive()
    assert commits_during_cut and commits_during_cut[0] >= 50, "the writer committed while the cut was open"
    assert 0 < sum(manifest.next_offsets().values()) < len(log), "the cut was taken mid-stream"
    loaded = _load(tmp_path, tmp_path / "cut", "loaded.duckdb")
    with DuckProjection.open(loaded) as copy:
        assert copy.applied_offsets() == {p: o for p, o in manifest.next_offsets().items() if p in manifest.offsets}
        _apply(copy, log, start=manifest.next_offsets())
        assert copy.table_digests() == expected


def _masked(doc: dict[str, Any]) -> dict[str, Any]:
    for entry in doc["tables"].values():
        entry["sha256"], entry["bytes"] = "<sha256>", "<bytes>"
    return doc


def test_the_manifest_format_is_pinned(tmp_path: Path) -> None:
    with _projection(tmp_path / "small.duckdb", _history(3, 40)) as projection:
        manifest = take_cut(projection, tmp_path / "cut", [1, 2])
    doc = json.loads((tmp_path / "cut" / MANIFEST).read_text("ascii"))
    assert doc == manifest.to_json()
    # The digests and sizes depend on DuckDB's Parquet writer; they are checked, not pinned.
    for table in CUT_TABLES:
        assert doc["tables"][table]["sha256"] == file_sha256(tmp_path / "cut" / f"{table}.parquet")
        assert doc["tables"][table]["bytes"] == (tmp_path / "cut" / f"{table}.parquet").stat().st_size
    assert _masked(doc) == json.loads(GOLDEN.read_text("utf-8"))
    assert manifest_from_json(json.loads((tmp_path / "cut" / MANIFEST).read_text("ascii"))) == manifest


@pytest.fixture
def cut(full: DuckProjection, tmp_path: Path) -> Path:
    take_cut(full, tmp_path / "cut")
    return tmp_path / "cut"


def _edit_manifest(cut: Path, **changes: Any) -> None:
    doc = json.loads((cut / MANIFEST).read_text("ascii"))
    doc.update(changes)
    (cut / MANIFEST).write_text(json.dumps(doc), "ascii")


def test_a_changed_byte_a_short_file_or_a_missing_file_is_damaged(cut: Path) -> None:
    verify_cut(cut)
    data = bytearray((cut / "turns.parquet").read_bytes())
    data[len(data) // 2] ^= 0x01
    (cut / "turns.parquet").write_bytes(bytes(data))
    with pytest.raises(SnapshotDamagedError, match="SHA-256"):
        verify_cut(cut)
    (cut / "turns.parquet").write_bytes(bytes(data[:-10]))
    with pytest.raises(SnapshotDamagedError, match="partial copy"):
        verify_cut(cut)
    (cut / "turns.parquet").unlink()
    with pytest.raises(SnapshotDamagedError, match="no file turns.parquet"):
        verify_cut(cut)


def test_a_manifest_that_does_not_parse_or_is_of_another_version_is_refused(cut: Path) -> None:
    raw = (cut / MANIFEST).read_text("ascii")
    (cut / MANIFEST).write_text(raw[:-20], "ascii")
    with pytest.raises(SnapshotDamagedError, match="not JSON"):
        read_manifest(cut)
    (cut / MANIFEST).write_text(raw, "ascii")
    _edit_manifest(cut, format="throughline.projection_snapshot.v2")
    with pytest.raises(SnapshotVersionError) as caught:
        read_manifest(cut)
    assert caught.value.code == "projection_snapshot_unsupported" and caught.value.exit_code == 2
    _edit_manifest(cut, format=FORMAT, schemaVersion="2")
    with pytest.raises(SnapshotVersionError, match="schema version '2'"):
        read_manifest(cut)
    _edit_manifest(cut, schemaVersion="3", partitions=[0, 0, 9])
    with pytest.raises(SnapshotDamagedError, match="partitions"):
        read_manifest(cut)
    (cut / MANIFEST).unlink()
    with pytest.raises(SnapshotDamagedError, match="no readable snapshot manifest"):
        read_manifest(cut)


def test_a_file_with_other_rows_than_the_manifest_says_is_damaged(cut: Path, tmp_path: Path) -> None:
    doc = json.loads((cut / MANIFEST).read_text("ascii"))
    doc["tables"]["turns"]["rows"] += 1
    (cut / MANIFEST).write_text(json.dumps(doc), "ascii")
    with pytest.raises(SnapshotDamagedError, match="holds .* rows, the manifest says"):
        load_cut(tmp_path / "x.duckdb", cut, verify_cut(cut))


def test_a_snapshot_of_another_log_or_ahead_of_it_is_refused(cut: Path) -> None:
    manifest = verify_cut(cut)
    ends = {p: o + 5 for p, o in manifest.next_offsets().items()}
    check_against_log(manifest, topic=TOPIC, topic_id=TOPIC_ID, partition_count=PARTITIONS, ends=ends)
    check_against_log(manifest, topic=TOPIC, topic_id=None, partition_count=PARTITIONS, ends=ends)
    refusals: list[tuple[dict[str, Any], type[ProjectionSnapshotError], str]] = [
        ({"topic": "other"}, SnapshotLogMismatchError, "not 'other'"),
        ({"topic_id": "BBBBBBBBBBBBBBBBBBBBBB"}, SnapshotLogMismatchError, "recreated"),
        ({"partition_count": 8}, SnapshotLogMismatchError, "has 8"),
        ({"ends": {**ends, 2: manifest.next_offsets()[2] - 1}}, SnapshotAheadOfLogError, "partition 2"),
    ]
    for change, error, text in refusals:
        kwargs: dict[str, Any] = {
            "topic": TOPIC,
            "topic_id": TOPIC_ID,
            "partition_count": PARTITIONS,
            "ends": ends,
            **change,
        }
        with pytest.raises(error, match=text) as caught:
            check_against_log(manifest, **kwargs)
        assert caught.value.exit_code == 2
    assert SnapshotLogMismatchError.code == "projection_snapshot_log_mismatch"
    assert SnapshotAheadOfLogError.code == "projection_snapshot_ahead_of_log"


def test_targets_and_partitions_are_checked(full: DuckProjection, cut: Path, tmp_path: Path) -> None:
    with pytest.raises(SnapshotTargetError):
        take_cut(full, cut)  # not empty
    with pytest.raises(SnapshotPartitionsError, match=r"\[4\]"):
        take_cut(full, tmp_path / "beyond", [1, 4])
    assert not (tmp_path / "beyond").exists()  # nothing left behind
    existing = tmp_path / "existing.duckdb"
    existing.write_bytes(b"x")
    with pytest.raises(SnapshotTargetError, match="only loads into"):  # refused before the log is asked
        load_cut_into(cut, existing, bootstrap_servers="127.0.0.1:1", topic=TOPIC)
    assert not (tmp_path / ("existing.duckdb" + PARTIAL_SUFFIX)).exists()
    assert parse_partitions(None) is None and parse_partitions("3,1, 1") == (1, 3) and parse_partitions([2]) == (2,)
    for bad in ("a", "-1", ",", "1.5"):
        with pytest.raises(SnapshotPartitionsError):
            parse_partitions(bad)


def test_a_projection_no_projector_bound_has_nothing_to_cut(tmp_path: Path) -> None:
    with DuckProjection.open(tmp_path / "new.duckdb", topic=TOPIC) as projection:
        with pytest.raises(SnapshotPartitionsError, match="no projector ran"):
            take_cut(projection, tmp_path / "cut")


class _Grants:
    """An ``auth`` that grants what the test says (the scoped tokens themselves are test_serve_scopes.py's)."""

    def __init__(self, scope: str) -> None:
        self.scope = scope

    def check(self, authorization: str | None) -> Any:
        from throughline.serve.tokens import Grant

        return Grant(scope=self.scope)  # type: ignore[arg-type]


@pytest.mark.parametrize("scope", ["read", "metrics", "admin"])
def test_only_the_admin_takes_a_snapshot_over_http(full: DuckProjection, tmp_path: Path, scope: str) -> None:
    import io
    import tarfile

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from throughline.serve.cut_api import SNAPSHOT_PATH, install_cut_route
    from throughline.serve.responses import install_error_handlers

    app = FastAPI()
    install_error_handlers(app)
    install_cut_route(app, lambda: full, _Grants(scope))  # type: ignore[arg-type]
    with TestClient(app) as client:
        answer = client.get(SNAPSHOT_PATH, params={"partitions": "0,3"})
        if scope != "admin":
            assert answer.status_code == 403 and answer.json()["error"]["code"] == "forbidden_scope"
            return
        assert answer.status_code == 200 and answer.headers["content-type"] == "application/x-tar"
        with tarfile.open(fileobj=io.BytesIO(answer.content)) as tar:
            assert sorted(tar.getnames()) == sorted([MANIFEST, *(f"{t}.parquet" for t in CUT_TABLES)])
            tar.extractall(tmp_path / "got", filter="data")
        assert verify_cut(tmp_path / "got").partitions == (0, 3)
        bad = client.get(SNAPSHOT_PATH, params={"partitions": "x"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "projection_snapshot_partitions"
    assert not [p for p in full.path.parent.iterdir() if ".snapshot-" in p.name]  # the temporary files are gone


def test_bootstrap_urls_tars_and_a_fetch_that_fails(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import io
    import tarfile

    from throughline.serve.cut_api import bootstrap_from, snapshot_url, unpack_cut
    from throughline.serve.exceptions import InvalidBootstrapUrlError

    assert snapshot_url("http://10.0.0.1:8787") == "http://10.0.0.1:8787/v1/admin/snapshot"
    assert snapshot_url("https://h/v1/admin/snapshot?partitions=1") == "https://h/v1/admin/snapshot?partitions=1"
    for bad in ("ftp://h/x", "h:8787", "http:///x"):
        with pytest.raises(InvalidBootstrapUrlError):
            snapshot_url(bad)

    nested = tmp_path / "nested.tar"
    with tarfile.open(nested, "w") as tar:
        info = tarfile.TarInfo("sub/manifest.json")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(SnapshotDamagedError, match="not a flat file"):
        unpack_cut(nested, tmp_path / "out")

    db = tmp_path / "new.duckdb"
    common: dict[str, Any] = {"bootstrap_servers": ["127.0.0.1:1"], "topic": TOPIC, "kafka_config": None}
    with caplog.at_level("WARNING", logger="throughline.serve"):
        assert not bootstrap_from("http://127.0.0.1:1", db, token=None, context=None, **common)
    assert "snapshot_fetch_failed" in caplog.text and "offset 0" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nested.tar", "out"]  # no file, no leftovers
    db.write_bytes(b"")
    caplog.clear()
    assert not bootstrap_from("http://127.0.0.1:1", db, token=None, context=None, **common)
    assert "snapshot_fetch_failed" not in caplog.text  # an existing file: nothing fetched


def test_a_download_cut_short_is_a_fetch_failure(tmp_path: Path) -> None:
    import http.server

    from throughline.serve.cut_api import fetch_cut
    from throughline.serve.exceptions import SnapshotFetchError

    class Short(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"0123456789")  # then the connection closes

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Short)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    try:
        with pytest.raises(SnapshotFetchError) as caught:
            fetch_cut(f"http://127.0.0.1:{server.server_port}/x", tmp_path / "t.tar", token=None, context=None)
        assert caught.value.retriable
    finally:
        thread.join(10)
        server.server_close()


def test_a_download_stops_once_cancelled_and_within_its_deadline(tmp_path: Path) -> None:
    import http.server

    from throughline.serve.cut_api import fetch_cut
    from throughline.serve.exceptions import SnapshotFetchError

    sent = threading.Event()

    class Trickle(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # 8 MiB over ~10 s: a slow holder
            self.send_response(200)
            self.send_header("Content-Length", str(500 * (16 << 10)))
            self.end_headers()
            try:
                for _ in range(500):
                    self.wfile.write(b"x" * (16 << 10))
                    self.wfile.flush()
                    sent.set()
                    time.sleep(0.02)
            except OSError:
                pass  # the client went away

        def log_message(self, *args: Any) -> None:
            pass

    for kind in ("cancel", "deadline"):
        sent.clear()
        server = http.server.HTTPServer(("127.0.0.1", 0), Trickle)
        thread = threading.Thread(target=server.handle_request, daemon=True)
        thread.start()
        cancel = threading.Event()
        if kind == "cancel":

            def cancel_soon(cancel: threading.Event = cancel) -> None:
                if sent.wait(10.0):
                    time.sleep(0.2)  # the download is under way
                    cancel.set()

            threading.Thread(target=cancel_soon, daemon=True).start()
        started = time.monotonic()
        try:
            with pytest.raises(SnapshotFetchError, match="cancelled" if kind == "cancel" else "longer than"):
                fetch_cut(
                    f"http://127.0.0.1:{server.server_port}/x",
                    tmp_path / f"{kind}.tar",
                    token=None,
                    context=None,
                    deadline=30.0 if kind == "cancel" else 0.5,
                    cancel=cancel,
                )
            assert time.monotonic() - started < 5.0  # long before the holder sent it all
        finally:
            thread.join(10)
            server.server_close()
