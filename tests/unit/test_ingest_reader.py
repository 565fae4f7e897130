"""The ingest file reader (lines, follow, truncation, rotation), its state file, and the ack bookkeeping.

The broker is replaced here by an in-memory sender whose acknowledgements the test controls: these
tests are about which lines the state may cover, not about Kafka (that is tests/integration).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from throughline.core.turn import TurnRecord
from throughline.log import BrokerUnavailableError
from throughline.producers.exceptions import IngestStateError, SendFailedError
from throughline.producers.ingest import (
    INGEST_STATE_SCHEMA,
    MAX_LINE_BYTES,
    FileId,
    Ingest,
    IngestState,
    LineReader,
    default_ingest_state_path,
    load_ingest_state,
    save_ingest_state,
)


def turn_line(n: int, **extra: Any) -> bytes:
    doc = {
        "project": "/p",
        "host": "h",
        "thread": "t",
        "turnId": f"turn-{n}",
        "completedAt": "2026-01-01T00:00:00Z",
        "body": f"body {n}",
        **extra,
    }
    return json.dumps(doc).encode() + b"\n"


def file_id(path: Path) -> FileId:
    return FileId.of(os.stat(path))


def where(state: IngestState | None) -> tuple[FileId, int, int] | None:
    return None if state is None else (state.file, state.offset, state.line)


# ---------------------------------------------------------------------------------------------- reader


def test_lines_offsets_and_a_last_line_without_newline(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"one\n\ntwo\r\nthree")
    reader = LineReader(str(path))
    lines = list(reader.lines())
    assert [(ln.number, ln.data, ln.end) for ln in lines] == [
        (1, b"one", 4),
        (2, b"", 5),
        (3, b"two\r", 10),
        (4, b"three", 15),
    ]
    assert reader.eof
    assert all(ln.file == file_id(path) for ln in lines)


def test_missing_file_without_follow_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(Exception) as info:
        LineReader(str(tmp_path / "nope.jsonl"))
    assert getattr(info.value, "code", None) == "file_not_found"


def test_following_waits_for_the_newline(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"first\nsec")
    reader = LineReader(str(path), follow=True)
    assert [ln.data for ln in reader.lines()] == [b"first"]
    assert list(reader.lines()) == []
    assert list(reader.check_file()) == []
    with open(path, "ab") as f:
        f.write(b"ond\nthi")
    lines = list(reader.lines())
    assert [(ln.number, ln.data, ln.end) for ln in lines] == [(2, b"second", 13)]
    assert not reader.eof


def test_following_a_truncated_file_starts_again_at_zero(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"aaaa\nbbbb\n")
    reader = LineReader(str(path), follow=True)
    assert len(list(reader.lines())) == 2
    path.write_bytes(b"c\n")  # truncate and rewrite, same inode
    assert list(reader.check_file()) == []
    assert [(ln.number, ln.data, ln.end) for ln in reader.lines()] == [(1, b"c", 2)]


def test_following_a_rotated_file_finishes_the_old_one_first(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"old-1\n")
    reader = LineReader(str(path), follow=True)
    assert [ln.data for ln in reader.lines()] == [b"old-1"]
    old_id = file_id(path)
    path.rename(tmp_path / "in.jsonl.1")
    with open(tmp_path / "in.jsonl.1", "ab") as f:
        f.write(b"old-2\nold-3-unterminated")
    path.write_bytes(b"new-1\n")
    finished = list(reader.check_file())
    assert [(ln.number, ln.data, ln.file) for ln in finished] == [
        (2, b"old-2", old_id),
        (3, b"old-3-unterminated", old_id),
    ]
    new = list(reader.lines())
    assert [(ln.number, ln.data, ln.file) for ln in new] == [(1, b"new-1", file_id(path))]


def test_following_a_file_that_does_not_exist_yet(tmp_path: Path) -> None:
    path = tmp_path / "later.jsonl"
    notices: list[str] = []
    reader = LineReader(str(path), follow=True, notice=notices.append)
    assert list(reader.lines()) == []
    path.write_bytes(b"x\n")
    assert list(reader.check_file()) == []
    assert [ln.data for ln in reader.lines()] == [b"x"]
    assert any("waiting" in n for n in notices) and any("appeared" in n for n in notices)


def test_an_over_long_line_is_dropped_and_the_next_line_is_intact(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    big = b"x" * (MAX_LINE_BYTES + 10)
    path.write_bytes(big + b"\nok\n")
    lines = list(LineReader(str(path)).lines())
    assert [(ln.number, ln.too_long, ln.data) for ln in lines] == [(1, len(big), b""), (2, 0, b"ok")]
    assert lines[0].end == len(big) + 1
    assert lines[1].end == len(big) + 4


def test_resume_from_a_state(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"a\nb\nc\n")
    state = IngestState(file_id(path), offset=4, line=2)
    assert [(ln.number, ln.data) for ln in LineReader(str(path), start=state).lines()] == [(3, b"c")]


def test_a_state_whose_line_is_no_longer_there_starts_at_zero(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"a\nb\nc\n")
    state = IngestState(file_id(path), offset=4, line=2, line_start=2, line_sha256=hashlib.sha256(b"b").digest())
    assert [ln.number for ln in LineReader(str(path), start=state).lines()] == [3]
    # rewritten in place (same inode, at least as long): the saved line is gone, so read it all again
    with open(path, "r+b") as f:
        f.write(b"x\ny\nz\nw\n")
    notices: list[str] = []
    lines = list(LineReader(str(path), start=state, notice=notices.append).lines())
    assert [ln.data for ln in lines] == [b"x", b"y", b"z", b"w"]
    assert any("no longer holds" in n for n in notices)


def test_the_saved_state_names_the_last_covered_line(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(turn_line(1) + turn_line(2))
    state_path = str(tmp_path / "state")
    Ingest(LineReader(str(path)), FakeSender(), state_path=state_path, err=io.StringIO()).run()
    state = load_ingest_state(state_path)
    assert state is not None and state.line_start == len(turn_line(1))
    assert state.line_sha256 == hashlib.sha256(turn_line(2).rstrip(b"\n")).digest()
    assert [ln.number for ln in LineReader(str(path), start=state).lines()] == []


def test_a_state_of_another_file_or_beyond_the_end_starts_at_zero(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"a\nb\n")
    other = IngestState(FileId(file_id(path).device, file_id(path).inode + 1), offset=2, line=1)
    assert [ln.number for ln in LineReader(str(path), start=other).lines()] == [1, 2]
    beyond = IngestState(file_id(path), offset=100, line=40)
    assert [ln.number for ln in LineReader(str(path), start=beyond).lines()] == [1, 2]


# ---------------------------------------------------------------------------------------------- state


def test_state_roundtrip_is_atomic(tmp_path: Path) -> None:
    target = str(tmp_path / "in.jsonl.ingest-state")
    assert load_ingest_state(target) is None
    state = IngestState(FileId(5, 7), offset=120, line=9)
    save_ingest_state(target, state, source_path=str(tmp_path / "in.jsonl"))
    assert load_ingest_state(target) == state
    doc = json.loads(Path(target).read_text())
    assert doc["schema"] == INGEST_STATE_SCHEMA and doc["offset"] == 120 and doc["line"] == 9
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl.ingest-state"]  # no temp file left behind
    assert default_ingest_state_path("x.jsonl") == "x.jsonl.ingest-state"


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        "{}",
        json.dumps({"schema": "other", "device": 1, "inode": 1, "offset": 0, "line": 0}),
        json.dumps({"schema": INGEST_STATE_SCHEMA, "device": 1, "inode": 1, "offset": -1, "line": 0}),
        json.dumps({"schema": INGEST_STATE_SCHEMA, "device": 1, "inode": 1, "offset": "3", "line": 0}),
    ],
)
def test_a_damaged_state_is_refused_not_ignored(tmp_path: Path, content: str) -> None:
    target = tmp_path / "s"
    target.write_text(content)
    with pytest.raises(IngestStateError) as info:
        load_ingest_state(str(target))
    assert info.value.exit_code == 2


# ---------------------------------------------------------------------------------------------- ingest


class FakePending:
    def __init__(self, turn: TurnRecord, outcome: Exception | None) -> None:
        self.turn = turn
        self.outcome = outcome
        self.done = False

    def result(self, timeout: float | None = None) -> tuple[int, int]:
        self.done = True
        if self.outcome is not None:
            raise self.outcome
        return (0, 0)


class FakeSender:
    """Acknowledges every turn, except the turn ids listed in ``failures`` (which fail)."""

    def __init__(self, failures: dict[str, Exception] | None = None) -> None:
        self.failures = failures or {}
        self.sent: list[FakePending] = []

    def send_async(self, turn: TurnRecord, *, validated: bool = False) -> FakePending:
        pending = FakePending(turn, self.failures.get(turn.turn_id))
        self.sent.append(pending)
        return pending

    def flush(self, timeout: float | None = None) -> None:
        for p in self.sent:
            p.done = True


def test_ingest_reports_bad_lines_and_covers_everything(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(turn_line(1) + b"\n" + b"{oops\n" + turn_line(4, seq="2") + turn_line(5))
    err = io.StringIO()
    state_path = str(tmp_path / "state")
    sender = FakeSender()
    stats = Ingest(LineReader(str(path)), sender, state_path=state_path, err=err).run()
    assert (stats.lines_read, stats.turns_sent, stats.rejected) == (5, 2, 2)
    assert [p.turn.turn_id for p in sender.sent] == ["turn-1", "turn-5"]
    assert err.getvalue().splitlines() == [
        "line 3: invalid_json: not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        "line 4: invalid_turn: seq: Input should be a valid integer",
    ]
    assert where(load_ingest_state(state_path)) == (file_id(path), path.stat().st_size, 5)
    assert dict(sender.sent[1].turn.producer.attributes) == {"ingest.line": "5"}


def test_the_state_never_covers_a_line_the_broker_did_not_acknowledge(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    lines = [turn_line(1), b"bad\n", turn_line(3), turn_line(4), b"\n", turn_line(6)]
    path.write_bytes(b"".join(lines))
    state_path = str(tmp_path / "state")
    sender = FakeSender({"turn-4": BrokerUnavailableError(["127.0.0.1:1"], "down")})
    with pytest.raises(BrokerUnavailableError):
        Ingest(LineReader(str(path)), sender, state_path=state_path, err=io.StringIO()).run()
    # Lines 1..3 are covered (acknowledged or rejected); line 4 failed, so neither it nor 5 and 6 are.
    assert where(load_ingest_state(state_path)) == (file_id(path), sum(len(x) for x in lines[:3]), 3)


def test_a_record_the_broker_refuses_for_good_is_a_rejected_line(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(turn_line(1) + turn_line(2) + turn_line(3))
    err = io.StringIO()
    sender = FakeSender({"turn-2": SendFailedError("the broker refused the record as too large", retriable=False)})
    stats = Ingest(LineReader(str(path)), sender, state_path=str(tmp_path / "s"), err=err).run()
    assert (stats.turns_sent, stats.rejected) == (2, 1)
    assert err.getvalue() == "line 2: send_failed: the broker refused the record as too large\n"
    assert load_ingest_state(str(tmp_path / "s")).line == 3  # type: ignore[union-attr]


def test_follow_stops_after_max_idle_and_saves(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(turn_line(1) + turn_line(2))
    state_path = str(tmp_path / "state")
    reader = LineReader(str(path), follow=True, poll_interval=0.01)
    stats = Ingest(reader, FakeSender(), state_path=state_path, max_idle=0.05, err=io.StringIO()).run()
    assert stats.turns_sent == 2
    assert where(load_ingest_state(state_path)) == (file_id(path), path.stat().st_size, 2)
