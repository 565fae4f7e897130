"""``throughline ingest --dry-run`` and the ``attributes`` of the jsonl ingest format.

The dry run contacts no broker (the bootstrap server named here refuses every connection, and the
runs finish at once), prints one jsonl ingest line per turn, and its output read back by
``throughline ingest - --dry-run`` is the same lines: the records would be the same.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from throughline.core.turn import build_turn
from throughline.producers.exceptions import InvalidAttributesError
from throughline.producers.ingest.dry import turn_line
from throughline.producers.ingest.jsonl import MAX_ATTRIBUTES, parse_turn_line

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text("utf-8"))


def cli(*args: str, stdin: bytes | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "THROUGHLINE_BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    env.pop("THROUGHLINE_KAFKA_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "throughline.cli", "ingest", *args],
        input=stdin,
        capture_output=True,
        env=env,
        timeout=60,
        cwd=cwd,
    )


def out_lines(proc: subprocess.CompletedProcess[bytes]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in proc.stdout.decode("utf-8").splitlines()]


def test_dry_run_prints_the_host_turns_in_file_order_and_feeds_back_unchanged(tmp_path: Path) -> None:
    root = tmp_path / "projects"
    shutil.copytree(FIXTURES / "claude-code" / "projects", root)
    proc = cli("--format", "claude-code", str(root), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    turns = out_lines(proc)
    assert len(turns) == 13
    assert all(
        list(t) == ["project", "host", "thread", "turnId", "seq", "completedAt", "body", "attributes"] for t in turns
    )
    first = turns[0]
    assert first["turnId"] == "p-1" and first["seq"] == 1 and first["completedAt"] == "2026-03-01T10:00:12.000000Z"
    # ended by the line after its end_turn message's last line (line 14)
    assert first["attributes"] == {"ingest.format": "claude-code", "ingest.line": "15", "turn.outcome": "answered"}
    # the same order on every run, and the same lines through the jsonl format
    assert cli("--format", "claude-code", str(root), "--dry-run").stdout == proc.stdout
    back = cli("-", "--dry-run", stdin=proc.stdout)
    assert back.returncode == 0, back.stderr
    assert back.stdout == proc.stdout
    assert b"would ingest 13 turns" in proc.stderr


def test_dry_run_reads_the_state_and_never_writes_it(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    rows = [
        {
            "project": "/p",
            "host": "h",
            "thread": "t",
            "turnId": f"t{i}",
            "completedAt": "2026-01-01T00:00:00Z",
            "body": f"b{i}",
        }
        for i in (1, 2)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    state = tmp_path / "state"
    proc = cli(str(path), "--dry-run", "--state", str(state))
    assert proc.returncode == 0 and [t["turnId"] for t in out_lines(proc)] == ["t1", "t2"]
    assert not state.exists()
    assert [t["seq"] for t in out_lines(proc)] == [None, None]


def test_dry_run_exit_codes_are_ingests(tmp_path: Path) -> None:
    missing = cli("--format", "codex", str(tmp_path / "nope"), "--dry-run")
    assert missing.returncode == 2 and missing.stdout == b""
    assert json.loads(missing.stderr.splitlines()[-1])["error"]["code"] == "file_not_found"
    follow = cli("--format", "codex", str(tmp_path), "--dry-run", "--follow")
    assert follow.returncode == 2 and json.loads(follow.stderr.splitlines()[-1])["error"]["code"] == "invalid_arguments"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"project": "/p", "host": "h", "thread": "t", "turnId": "a", "completedAt": '
        '"2026-01-01T00:00:00Z", "body": "b", "attributes": {"n": 1}}\n'
    )
    rejected = cli(str(bad), "--dry-run")
    assert rejected.returncode == 2 and rejected.stdout == b""
    assert b"line 1: invalid_attributes: attributes.n: must be a string, not int" in rejected.stderr
    settle = cli(str(bad), "--dry-run", "--settle", "0")
    assert settle.returncode == 2 and b"--settle is for the host formats" in settle.stderr


def test_codex_dry_run_prints_the_fixtures_turns_file_by_file(tmp_path: Path) -> None:
    proc = cli("--format", "codex", str(FIXTURES / "codex" / "sessions"), "--dry-run", "--settle", "0")
    assert proc.returncode == 0, proc.stderr
    expected = [
        (t["turnId"], t["seq"], t["completedAt"])
        for path, turns in sorted(EXPECTED["turns"].items())
        if path.startswith("codex/")
        for t in turns
    ]
    assert expected
    assert [(t["turnId"], t["seq"], t["completedAt"]) for t in out_lines(proc)] == expected


BASE = {
    "project": "/p",
    "host": "h",
    "thread": "t",
    "turnId": "a",
    "completedAt": "2026-01-01T00:00:00Z",
    "body": "b",
}


def parse(**fields: Any) -> Any:
    return parse_turn_line(json.dumps({**BASE, **fields}), attributes={"ingest.line": "7"})


def test_a_lines_attributes_are_the_records_and_win_over_ingests() -> None:
    turn = parse(
        attributes={
            "ingest.line": "14",
            "ingest.format": "claude-code",
            "turn.outcome": "interrupted",
            "x": "",
        }
    )
    assert dict(turn.producer.attributes) == {
        "ingest.line": "14",
        "ingest.format": "claude-code",
        "turn.outcome": "interrupted",
        "x": "",
    }
    assert dict(parse().producer.attributes) == {"ingest.line": "7"}
    assert dict(parse(attributes=None).producer.attributes) == {"ingest.line": "7"}
    assert parse_turn_line(json.dumps(turn_line(turn))).producer.attributes == turn.producer.attributes


@pytest.mark.parametrize(
    "attributes",
    [
        {"n": 1},
        {"n": None},
        {"n": {"deep": "x"}},
        ["a"],
        "a=b",
        {"": "x"},
        {"k" * 257: "x"},
        {"a\u0000b": "x"},
        {"x": "\ud800"},
        {"turn.outcome": "maybe"},
        {"ingest.line": "0"},
        {"ingest.line": "+3"},
        {"ingest.bodyTruncated": "yes"},
        {"ingest.bodyBytes": "-1"},
        {"ingest.format": "Claude Code"},
        {f"k{i}": "v" for i in range(MAX_ATTRIBUTES + 1)},
        {"big": "x" * (64 * 1024)},
    ],
)
def test_bad_attributes_are_a_typed_error(attributes: Any) -> None:
    with pytest.raises(InvalidAttributesError) as info:
        parse(attributes=attributes)
    assert info.value.code == "invalid_attributes"


def test_turn_line_prints_the_record_time_in_utc_microseconds() -> None:
    turn = build_turn(
        project="/p/",
        host="h",
        thread="t",
        turn_id="a",
        completed_at_micros=1_500_000,
        body="é",
        seq=3,
        attributes={"b": "2", "a": "1"},
    )
    assert turn_line(turn) == {
        "project": "/p",
        "host": "h",
        "thread": "t",
        "turnId": "a",
        "seq": 3,
        "completedAt": "1970-01-01T00:00:01.500000Z",
        "body": "é",
        "attributes": {"a": "1", "b": "2"},
    }
