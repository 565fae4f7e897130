"""Repairs (docs/spec.md#quarantine) end to end, through the CLI against the real broker: a gap breaks a source, ``throughline
quarantine`` lists it, ``throughline repair`` appends the repair, the projector applies it, reads serve
the source again with the turns that follow, and ``throughline replay`` reproduces the repaired
projection exactly. A projector killed just before or just after the repair's commit loses and
duplicates nothing (tests/integration/commit_kill/sitecustomize.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from projector_env import (
    assert_projection_equals_log,
    cli,
    cli_process,
    connection,
    exactly_once_invariants,
    fold_topic,
)

from throughline.core.identity import project_sha256, source_sha256
from throughline.projector.store import DuckProjection
from throughline.testing import create_topic

PROJECT, HOST, THREAD = "/work/app", "laptop", "main"
LOSSLESS = {"retention.ms": "-1", "retention.bytes": "-1"}  # what ingest and repair require of the topic


def _turns(path: Path, *turns: tuple[str, int, str]) -> Path:
    """A JSON Lines file of turns (turn id, seq, body) of the one source."""
    lines = [
        json.dumps(
            {
                "project": PROJECT,
                "host": HOST,
                "thread": THREAD,
                "turnId": tid,
                "completedAt": f"2026-01-02T10:0{seq}:00Z",
                "body": body,
                "seq": seq,
            }
        )
        for tid, seq, body in turns
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _ok(code: int, out: str, err: str) -> str:
    assert code == 0, err
    return out


def _read(conn: list[str], tmp: Path) -> tuple[int, dict[str, Any]]:
    code, out, err = cli("read", "--project", PROJECT, "--wait", "5", *conn)
    return code, json.loads(out if code == 0 else err.strip().splitlines()[-1])


def _setup(bootstrap: str, topic: str, db: Path) -> tuple[list[str], list[str]]:
    """A lossless one-partition topic; the flags of commands with a projection, and of those without."""
    create_topic(bootstrap, topic, partitions=1, configs=LOSSLESS)
    return connection(bootstrap, topic, db), ["--bootstrap-servers", bootstrap, "--topic", topic]


def _seqs(page: dict[str, Any]) -> list[int]:
    return [t["seq"] for t in page["turns"]]


def test_a_gap_is_listed_repaired_served_again_and_replayed(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    topic = kafka_topic_name
    db = tmp_path / "demo.duckdb"
    conn, log_flags = _setup(kafka_bootstrap, topic, db)
    source = source_sha256(project_sha256(PROJECT), HOST, THREAD)

    first = _turns(
        tmp_path / "turns.jsonl", ("t1", 1, "first"), ("t2", 2, "second"), ("t3", 3, "third"), ("t5", 5, "fifth")
    )
    _ok(*cli("ingest", str(first), *log_flags))
    _ok(*cli("project", "--until-caught-up", *conn))
    code, error = _read(conn, tmp_path)
    assert code == 1 and error["error"]["code"] == "source_quarantined", error
    assert "throughline quarantine" in error["error"]["message"] and "throughline repair" in error["error"]["message"]

    listed = json.loads(_ok(*cli("quarantine", "--json", "--project", PROJECT, "--db", str(db), "--topic", topic)))
    (broken,) = listed["brokenSources"]
    assert broken["sourceSha256"] == source.hex() and broken["length"] == 3 and broken["unrepaired"] == 1
    (record,) = listed["records"]
    assert (record["offset"], record["code"], record["repairedBy"]) == (3, "chain_rejected", None)

    dry = json.loads(
        _ok(
            *cli(
                "repair",
                "--project",
                PROJECT,
                "--source",
                source.hex(),
                "--reason",
                "turn 4 was lost",
                "--dry-run",
                "--db",
                str(db),
                "--topic",
                topic,
            )
        )
    )
    assert dry["wouldChange"]["outcome"] == "repaired" and dry["wouldChange"]["acceptedLength"] == 3
    appended = json.loads(
        _ok(
            *cli(
                "repair",
                "--project",
                PROJECT,
                "--host",
                HOST,
                "--thread",
                THREAD,
                "--reason",
                "turn 4 was lost",
                *log_flags,
            )
        )
    )
    assert appended["appended"] == {"partition": 0, "offset": 4}
    # The turns that follow: the next seq of the accepted chain, then one more.
    after = _turns(tmp_path / "after.jsonl", ("t4", 4, "fourth"), ("t6", 5, "sixth"))
    _ok(*cli("ingest", str(after), *log_flags))
    _ok(*cli("project", "--until-caught-up", *conn))

    code, page = _read(conn, tmp_path)
    assert code == 0, page
    assert _seqs(page) == [1, 2, 3, 4, 5]
    repaired = json.loads(_ok(*cli("quarantine", "--json", "--db", str(db), "--topic", topic)))
    assert repaired["brokenSources"] == [] and repaired["counts"]["repaired"] == 1
    assert repaired["records"][0]["repairedBy"] == {"partition": 0, "offset": 4}
    (repair,) = repaired["repairs"]
    assert (repair["offset"], repair["outcome"], repair["marked"], repair["length"]) == (4, "repaired", 1, 3)
    status = json.loads(_ok(*cli("status", "--json", *conn)))
    assert status["counts"]["brokenSources"] == 0 and status["counts"]["repairs"] == 1

    rebuilt = tmp_path / "rebuilt.duckdb"
    _ok(*cli("replay", "--no-progress", *connection(kafka_bootstrap, topic, rebuilt)))
    with DuckProjection.open(db, read_only=True) as a, DuckProjection.open(rebuilt, read_only=True) as b:
        assert a.table_digests() == b.table_digests()
    assert_projection_equals_log(rebuilt, fold_topic(kafka_bootstrap, topic))
    code, replayed = _read(connection(kafka_bootstrap, topic, rebuilt), tmp_path)
    assert code == 0 and replayed["throughCursor"] == page["throughCursor"] and _seqs(replayed) == _seqs(page)


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_kill_around_the_repairs_commit_loses_and_duplicates_nothing(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path, when: str
) -> None:
    topic = kafka_topic_name
    db = tmp_path / "p.duckdb"
    conn, log_flags = _setup(kafka_bootstrap, topic, db)
    _ok(*cli("ingest", str(_turns(tmp_path / "a.jsonl", ("t1", 1, "a"), ("t3", 3, "gap"))), *log_flags))
    _ok(*cli("project", "--until-caught-up", *conn))
    _ok(*cli("repair", "--project", PROJECT, "--host", HOST, "--thread", THREAD, "--reason", "accept", *log_flags))
    _ok(*cli("ingest", str(_turns(tmp_path / "b.jsonl", ("t2", 2, "b"))), *log_flags))

    marker = tmp_path / "kill.armed"
    marker.write_text("armed")
    here = Path(__file__).resolve().parent / "commit_kill"
    path = os.environ.get("PYTHONPATH", "")
    env = {
        **os.environ,
        "THROUGHLINE_TEST_KILL_AT_REPAIR": f"{when}:{marker}",
        "PYTHONPATH": f"{here}{os.pathsep}{path}" if path else str(here),
    }
    killed = cli_process("project", "--until-caught-up", *conn, env=env)
    assert killed.returncode == -9 and not marker.exists(), killed.stderr  # SIGKILLed at the repair's batch
    with DuckProjection.open(db, read_only=True) as projection:
        repairs = projection.stats().repairs
    assert repairs == (0 if when == "before" else 1)  # the commit happened or it did not, nothing between
    exactly_once_invariants(db)

    done = cli_process("project", "--until-caught-up", *conn)
    assert done.returncode == 0, done.stderr
    exactly_once_invariants(db)
    assert_projection_equals_log(db, fold_topic(kafka_bootstrap, topic))
    with DuckProjection.open(db, read_only=True) as projection:
        listing = projection.quarantine()
    assert len(listing.repairs) == 1 and listing.broken == () and listing.records[0].repaired_by == (0, 2)
    code, page = _read(conn, tmp_path)
    assert code == 0 and _seqs(page) == [1, 2]
