"""``throughline quarantine`` and ``throughline repair --dry-run`` over a projection built without Kafka.

The projection holds, on one partition: a source broken by two gaps after three turns, a healthy
source, an undecodable record, and a turn of another project whose content digest is wrong (refused
before the fold, with its hashes). Output is hashes only: no project, host, thread or turn id.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from throughline.commands.quarantine import QUARANTINE_SCHEMA, collect_quarantine, render_quarantine
from throughline.commands.repair import dry_run_document
from throughline.core.identity import project_sha256, source_sha256
from throughline.core.turn import TurnRecord, build_turn
from throughline.projector.store import DuckProjection, LogRecord
from throughline.schemas.codec import encode_turn

CLI = str(Path(sys.executable).with_name("throughline"))
TOPIC = "throughline.turns"
PROJECT, OTHER = "/work/secret-app", "/work/other-secret"
HOST, THREAD = "laptop-of-ann", "thread-xyzzy"
BROKEN = source_sha256(project_sha256(PROJECT), HOST, THREAD)
HEALTHY = source_sha256(project_sha256(PROJECT), HOST, "healthy-thread")
PRODUCED_AT = 1_767_225_601_000_000


def _turn(turn_id: str, seq: int | None, project: str = PROJECT, thread: str = THREAD) -> TurnRecord:
    return build_turn(
        project=project,
        host=HOST,
        thread=thread,
        turn_id=f"turn-id-{turn_id}",
        completed_at_micros=1_767_225_600_000_000,
        body="a body nobody may print",
        seq=seq,
        produced_at_micros=PRODUCED_AT,
    )


@pytest.fixture(scope="module")
def db_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("quarantine") / "q.duckdb"
    tampered = dataclasses.replace(_turn("t", None, project=OTHER), body="tampered")
    records = [
        _turn("a", 1),
        _turn("b", 2),
        _turn("c", 3),
        _turn("h1", None, thread="healthy-thread"),
        _turn("e", 5),  # offset 4: a gap, the source breaks
        _turn("f", 6),  # offset 5: another gap
    ]
    log = [LogRecord(0, i, r.project_sha256, encode_turn(r)) for i, r in enumerate(records)]
    log += [LogRecord(0, 6, b"key", b"not avro"), LogRecord(0, 7, tampered.project_sha256, encode_turn(tampered))]
    with DuckProjection.open(path, topic=TOPIC) as projection:
        projection.bind_log(TOPIC, "topic-id", 1)
        projection.apply_batch(TOPIC, 0, log)
    return str(path)


def test_the_document_lists_records_broken_sources_and_counts(db_path: str) -> None:
    doc = collect_quarantine(db_path, TOPIC, None)
    assert doc["schema"] == QUARANTINE_SCHEMA and doc["topic"] == TOPIC and doc["projectSha256"] is None
    assert doc["counts"] == {
        "records": 4,
        "unrepaired": 4,
        "repaired": 0,
        "brokenSources": 1,
        "repairs": 0,
        "byCode": {"chain_rejected": 2, "record_invalid": 1, "record_undecodable": 1},
    }
    assert [(q["partition"], q["offset"], q["code"]) for q in doc["records"]] == [
        (0, 4, "chain_rejected"),
        (0, 5, "chain_rejected"),
        (0, 6, "record_undecodable"),
        (0, 7, "record_invalid"),
    ]
    gap = doc["records"][0]
    assert gap["reason"] == "seq 5 leaves a gap after length 3"
    assert gap["sourceSha256"] == BROKEN.hex() and gap["projectSha256"] == project_sha256(PROJECT).hex()
    assert gap["when"] == "2026-01-01T00:00:01.000000Z" and gap["repairedBy"] is None
    junk = doc["records"][2]
    assert junk["when"] is None and junk["sourceSha256"] is None and junk["valueBytes"] == len(b"not avro")
    assert doc["records"][3]["projectSha256"] == project_sha256(OTHER).hex()
    (broken,) = doc["brokenSources"]
    assert broken == {
        "sourceSha256": BROKEN.hex(),
        "projectSha256": project_sha256(PROJECT).hex(),
        "length": 3,
        "code": "chain_rejected",
        "reason": "seq 5 leaves a gap after length 3",
        "brokenAt": {"partition": 0, "offset": 4},
        "unrepaired": 2,
    }
    assert doc["repairs"] == []


def test_a_project_filter_keeps_that_projects_records_only(db_path: str) -> None:
    doc = collect_quarantine(db_path, TOPIC, project_sha256(PROJECT))
    assert [q["offset"] for q in doc["records"]] == [4, 5]
    assert len(doc["brokenSources"]) == 1
    other = collect_quarantine(db_path, TOPIC, project_sha256(OTHER))
    assert [q["offset"] for q in other["records"]] == [7] and other["brokenSources"] == []
    nothing = collect_quarantine(db_path, TOPIC, project_sha256("/nobody"))
    assert nothing["records"] == [] and nothing["counts"]["records"] == 0


def test_the_table_names_the_full_source_hash_to_repair(db_path: str) -> None:
    text = render_quarantine(collect_quarantine(db_path, TOPIC, None))
    assert f"source {BROKEN.hex()}" in text
    assert "4 quarantined records (4 unrepaired, 0 repaired), 1 broken source, 0 repairs" in text
    assert "p0@4  2026-01-01T00:00:01.000000Z  chain_rejected: seq 5 leaves a gap after length 3" in text


def test_dry_run_says_what_a_repair_would_change(db_path: str) -> None:
    from throughline.core.repair import build_repair

    repair = build_repair(project=PROJECT, host=HOST, thread=THREAD, reason="seq 4 is lost")
    doc = dry_run_document(db_path, TOPIC, repair)
    assert doc["dryRun"] is True and doc["repair"]["partition"] == 0
    assert doc["projection"] == {
        "db": db_path,
        "appliedOffset": 8,
        "source": {"known": True, "length": 3, "broken": True, "reason": "seq 5 leaves a gap after length 3"},
    }
    assert doc["wouldChange"] == {
        "outcome": "repaired",
        "clearsBrokenMark": True,
        "acceptedLength": 3,
        "marks": [
            {"partition": 0, "offset": 4, "code": "chain_rejected"},
            {"partition": 0, "offset": 5, "code": "chain_rejected"},
        ],
    }
    healthy = dry_run_document(db_path, TOPIC, build_repair(project=PROJECT, source=HEALTHY, reason="why not"))
    assert healthy["wouldChange"]["outcome"] == "not_broken" and healthy["wouldChange"]["marks"] == []
    unknown = dry_run_document(db_path, TOPIC, build_repair(project=PROJECT, host=HOST, thread="typo", reason="oops"))
    assert unknown["wouldChange"]["outcome"] == "unknown_source" and unknown["projection"]["source"]["known"] is False
    # The broken source named under another project is not that project's source.
    foreign = dry_run_document(db_path, TOPIC, build_repair(project=OTHER, source=BROKEN, reason="wrong project"))
    assert foreign["wouldChange"]["outcome"] == "unknown_source"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin"}  # no THROUGHLINE_* from the caller's environment
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=60, check=False, env=env)


def test_the_commands_print_hashes_only_and_exit_zero(db_path: str) -> None:
    outputs = [
        _run("quarantine", "--db", db_path),
        _run("quarantine", "--db", db_path, "--json", "--project", PROJECT),
        _run(
            "repair",
            "--db",
            db_path,
            "--project",
            PROJECT,
            "--host",
            HOST,
            "--thread",
            THREAD,
            "--reason",
            "r",
            "--dry-run",
        ),
        _run("repair", "--db", db_path, "--project", PROJECT, "--source", BROKEN.hex(), "--reason", "r", "--dry-run"),
    ]
    for done in outputs:
        assert done.returncode == 0, done.stderr
        text = done.stdout + done.stderr
        for raw in (PROJECT, OTHER, HOST, THREAD, "healthy-thread", "turn-id-", "a body nobody may print", "tampered"):
            assert raw not in text, (raw, done.args)
    doc = json.loads(outputs[1].stdout)
    assert doc["counts"]["records"] == 2
    by_names, by_hash = (json.loads(done.stdout) for done in outputs[2:])
    for dry in (by_names, by_hash):
        del dry["repair"]["requestedAt"]  # the operator's clock, at each call
    assert by_names == by_hash and by_names["wouldChange"]["outcome"] == "repaired"


@pytest.mark.parametrize(
    ("args", "code", "exit_code"),
    [
        (["repair", "--project", PROJECT, "--host", HOST, "--reason", "r"], "invalid_arguments", 2),
        (["repair", "--project", PROJECT, "--source", "abc", "--reason", "r"], "invalid_source", 2),
        (
            ["repair", "--project", PROJECT, "--source", BROKEN.hex(), "--thread", THREAD, "--reason", "r"],
            "invalid_arguments",
            2,
        ),
        (["repair", "--project", PROJECT, "--source", BROKEN.hex(), "--reason", " "], "invalid_reason", 2),
        (["repair", "--project", "", "--source", BROKEN.hex(), "--reason", "r"], "invalid_project", 2),
        (["repair", "--project", PROJECT, "--source", BROKEN.hex()], "invalid_arguments", 2),
        (["repair", "--project", PROJECT, "--source", BROKEN.hex(), "--reason", "r"], "missing_bootstrap_servers", 2),
        (["quarantine", "--project", ""], "invalid_project", 2),
    ],
)
def test_input_errors_have_their_codes(db_path: str, args: list[str], code: str, exit_code: int) -> None:
    done = _run(*args, "--db", db_path)
    assert done.returncode == exit_code, done.stderr
    assert json.loads(done.stderr.strip().splitlines()[-1])["error"]["code"] == code


def test_a_missing_projection_is_projection_missing(tmp_path: Path) -> None:
    for args in (
        ["quarantine"],
        ["repair", "--project", PROJECT, "--source", BROKEN.hex(), "--reason", "r", "--dry-run"],
    ):
        done = _run(*args, "--db", str(tmp_path / "none.duckdb"))
        assert done.returncode == 1
        assert json.loads(done.stderr.strip().splitlines()[-1])["error"]["code"] == "projection_missing"
