"""The stored turn keys handed from one process to the next that opens the file (a rebuild's replay to
``serve``: ``DuckProjection.keep_turn_keys`` / ``save_turn_keys`` / ``adopt_turn_keys``): adopted only
when exact for the file as it is, so that the staged fold's duplicate check answers as after a scan."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from projector_histories import TOPIC, turn

from throughline.projector.rebuild_files import RebuildFiles, turn_keys_of
from throughline.projector.store import DuckProjection, LogRecord
from throughline.schemas.codec import encode_turn


def _record_at(partition: int, offset: int, turn_id: str) -> LogRecord:
    r = turn(turn_id=turn_id)
    return LogRecord(partition, offset, r.project_sha256, encode_turn(r))


def _written(path: Path, turns: int, keep: bool = True) -> Path:
    """A new file with ``turns`` turns committed, its keys saved beside it when kept."""
    with DuckProjection.open(path, topic=TOPIC) as projection:
        if keep:
            assert projection.keep_turn_keys()  # a new file: kept from its first commit
        records = [_record_at(0, i, f"old{i}") for i in range(turns)]
        projection.apply_prepared(TOPIC, [projection.prepare(0, records[: turns // 2])])
        projection.apply_prepared(TOPIC, [projection.prepare(0, records[turns // 2 :])])
        assert projection.save_turn_keys(turn_keys_of(path)) is keep
    return turn_keys_of(path)


def test_a_new_file_s_keys_are_adopted_by_the_next_handle_and_answer_as_a_scan(tmp_path: Path) -> None:
    path = tmp_path / "p.duckdb"
    _written(path, 300)
    with DuckProjection.open(path, topic=TOPIC) as projection:
        keys = projection._staging.stored_keys
        assert projection.adopt_turn_keys(turn_keys_of(path))
        assert keys.ready and keys._thread is None  # ready at once: no scan of turn_ids
        fresh = [_record_at(0, 300 + i, f"new{i}") for i in range(100)]
        again = [_record_at(0, 400, "old7"), _record_at(0, 401, "old299")]  # stored turns, sent again
        poll = [projection.prepare(0, [*fresh, *again])]
        again_keys = {it.turn_key for b in poll for it in b.items if it.offset >= 400}
        assert again_keys <= set(keys.maybe_stored(list(again_keys)) or [])  # no false negative
        layer = projection.stage(TOPIC, poll)
        assert layer is not None and len(layer.turn_keys) == 100  # the two are duplicates, not appended
        projection.apply_prepared(TOPIC, poll)
        assert not projection._staging.off  # the commit agreed with the staged fold


def test_keys_of_another_state_of_the_file_are_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "p.duckdb"
    handed = _written(path, 40)
    with DuckProjection.open(path, topic=TOPIC) as later:  # a commit the hand-over does not hold
        later.apply_prepared(TOPIC, [later.prepare(0, [_record_at(0, 40, "later")])])
    with DuckProjection.open(path, topic=TOPIC) as projection, caplog.at_level(logging.WARNING):
        assert not projection.adopt_turn_keys(handed)
        assert not projection._staging.stored_keys.ready  # scanned as before, once staging starts
    assert "another state of the file" in caplog.text


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda b: b[: len(b) // 2], "cut short"),
        (lambda b: b"not json\n" + b.split(b"\n", 1)[1], "Expecting value"),
        (lambda b: json.dumps({"format": 2}).encode() + b"\n" + b.split(b"\n", 1)[1], "format 1"),
    ],
    ids=["truncated", "no-header", "other-format"],
)
def test_a_damaged_hand_over_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture, damage, why: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "p.duckdb"
    handed = _written(path, 40)
    handed.write_bytes(damage(handed.read_bytes()))
    with DuckProjection.open(path, topic=TOPIC) as projection, caplog.at_level(logging.WARNING):
        assert not projection.adopt_turn_keys(handed)
        assert not projection._staging.stored_keys.ready
    assert why in caplog.text


def test_a_file_with_turns_keeps_none_and_a_missing_hand_over_is_a_scan(tmp_path: Path) -> None:
    path = tmp_path / "p.duckdb"
    _written(path, 10, keep=False)  # kept nothing: saved nothing
    assert not turn_keys_of(path).exists()
    with DuckProjection.open(path, topic=TOPIC) as projection:
        assert not projection.keep_turn_keys()  # turns stored before: a filter from here would miss them
        assert not projection.save_turn_keys(turn_keys_of(path))
        assert not projection.adopt_turn_keys(turn_keys_of(path))  # none there: quietly a scan


def test_an_unfinished_rebuild_s_hand_over_goes_with_its_file(tmp_path: Path) -> None:
    files = RebuildFiles(tmp_path / "p.duckdb")
    handed = _written(files.rebuilt, 5)
    partial = handed.with_name(handed.name + ".tmp")
    partial.write_bytes(b"half")
    files.remove_unfinished()
    assert not handed.exists() and not partial.exists() and not files.rebuilt.exists()
