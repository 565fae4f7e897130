"""The read wire ``throughline.observer_read.v1``: the committed schema, invariants, body cutting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from throughline.reader import ObserverRead, cut_body
from throughline.reader.wire import json_schema, json_schema_text

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "schemas" / "observer_read.v1.schema.json"

TURN = {
    "seq": 3,
    "completedAt": "2026-01-02T03:04:05.000006Z",
    "body": "hi",
    "bodyBytes": 2,
    "bodyTruncated": False,
    "contentDigest": "a" * 64,
    "chainDigest": "b" * 64,
}


def _doc(**changes: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "schema": "throughline.observer_read.v1",
        "status": "ok",
        "thread": {"sourceSha256": "c" * 64},
        "afterCursor": None,
        "throughCursor": "tlc1.x",
        "turns": [TURN],
        "historyTruncated": False,
        "page": {"complete": True, "nextToken": None},
    }
    doc.update(changes)
    return doc


def test_committed_schema_equals_the_generated_one() -> None:
    assert SCHEMA_FILE.read_text() == json_schema_text(), (
        "regenerate: python -m throughline.reader.wire > schemas/observer_read.v1.schema.json"
    )


def test_schema_lists_exactly_the_adr_fields() -> None:
    schema = json_schema()
    assert schema["$id"] == "throughline.observer_read.v1"
    assert set(schema["properties"]) == set(schema["required"]) == set(_doc())
    assert schema["additionalProperties"] is False
    turn = schema["$defs"]["TurnRecordWire"]
    assert set(turn["properties"]) == set(turn["required"]) == set(TURN)


def test_round_trip() -> None:
    read = ObserverRead.model_validate(_doc())
    assert json.loads(read.to_json()) == _doc()
    assert ObserverRead.from_json(read.to_json()) == read


@pytest.mark.parametrize(
    "changes",
    [
        {"schema": "throughline.observer_read.v2"},
        {"status": "maybe"},
        {"extra": 1},
        {"thread": {"sourceSha256": "host-alpha"}},
        {"page": {"complete": True, "nextToken": "tlp1.a.b"}},
        {"page": {"complete": False, "nextToken": None}},  # an incomplete ok page needs its token
        {"status": "projection_pending", "turns": [TURN], "page": {"complete": False, "nextToken": None}},
        {"status": "resync_required", "turns": [], "page": {"complete": True, "nextToken": None}},
        {"status": "resync_required", "turns": [], "historyTruncated": True},
        {"turns": [TURN, TURN]},  # out of order / duplicate
        {"turns": [{**TURN, "completedAt": "2026-01-02 03:04:05Z"}]},
        {"turns": [{**TURN, "turnId": "raw"}]},
        {"turns": [{**TURN, "seq": 0}]},
    ],
)
def test_invalid_documents_are_refused(changes: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ObserverRead.model_validate(_doc(**changes))


def test_documents_are_frozen() -> None:
    read = ObserverRead.model_validate(_doc())
    with pytest.raises(ValidationError):
        read.status = "resync_required"  # type: ignore[misc]


@given(st.text(), st.integers(0, 200))
def test_cut_body_is_a_prefix_at_a_character_boundary(body: str, limit: int) -> None:
    body = body.encode("utf-8", "replace").decode("utf-8", "replace") if body else body
    try:
        full = body.encode("utf-8")
    except UnicodeEncodeError:
        return
    cut, size, truncated = cut_body(body, limit)
    assert size == len(full)
    assert truncated == (len(full) > limit)
    assert body.startswith(cut)
    assert len(cut.encode("utf-8")) <= limit or not truncated
    if truncated:
        # The longest prefix that fits: one more character would exceed the bound.
        assert len(body[: len(cut) + 1].encode("utf-8")) > limit
    else:
        assert cut == body
