"""Parsing one JSON Lines line of ``throughline ingest`` into a turn (strict, with stable error codes)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from throughline.core.chain import content_digest
from throughline.core.identity import canonical_project
from throughline.core.turn import MAX_BODY_BYTES, ProducerStamp, TurnRecord, format_rfc3339, parse_rfc3339
from throughline.errors import InputError
from throughline.producers.ingest import MAX_LINE_BYTES, parse_turn_line

GOOD = {
    "project": "/work/app/",
    "host": "host-a",
    "thread": "thread-1",
    "turnId": "turn-1",
    "completedAt": "2026-01-01T00:00:00Z",
    "body": "hello",
}


def line(**changes: object) -> str:
    doc = {**GOOD, **changes}
    return json.dumps({k: v for k, v in doc.items() if v is not _DROP})


_DROP = object()


def code_of(raw: str | bytes) -> str:
    with pytest.raises(InputError) as info:
        parse_turn_line(raw)
    assert info.value.exit_code == 2
    return info.value.code


def test_a_good_line() -> None:
    turn = parse_turn_line(line(seq=4).encode())
    assert isinstance(turn, TurnRecord)
    assert turn.project == "/work/app"
    assert (turn.host, turn.thread, turn.turn_id, turn.seq) == ("host-a", "thread-1", "turn-1", 4)
    assert turn.completed_at_micros == parse_rfc3339("2026-01-01T00:00:00Z")
    assert turn.content_digest == content_digest("turn-1", turn.completed_at_micros, "hello")


def test_seq_is_optional_and_may_be_null() -> None:
    assert parse_turn_line(line()).seq is None  # type: ignore[union-attr]
    assert parse_turn_line(line(seq=None)).seq is None  # type: ignore[union-attr]


def test_producer_fields_are_passed_through() -> None:
    turn = parse_turn_line(
        line(), producer_name="ingest", producer_version="1.2", produced_at_micros=7, attributes={"ingest.line": "3"}
    )
    assert turn is not None
    assert turn.producer == ProducerStamp("ingest", "1.2", 7, {"ingest.line": "3"})


@pytest.mark.parametrize("raw", ["", " ", "\t", "\r", b"   ", b"\xef\xbb\xbf"])
def test_blank_lines_are_skipped(raw: str | bytes) -> None:
    assert parse_turn_line(raw) is None


def test_bom_and_crlf_are_tolerated() -> None:
    assert parse_turn_line(b"\xef\xbb\xbf" + line().encode() + b"\r") is not None


def test_multiline_and_non_ascii_bodies() -> None:
    turn = parse_turn_line(line(body="line 1\nline 2\n日本語 ✓ \u00e9"))
    assert turn is not None and turn.body == "line 1\nline 2\n日本語 ✓ \u00e9"


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("not json", "invalid_json"),
        ("{", "invalid_json"),
        ("[1, 2]", "invalid_json"),
        ('"a string"', "invalid_json"),
        ("3", "invalid_json"),
        ("null", "invalid_json"),
        ('{"project": "a", "project": "b"}', "invalid_json"),
        (b"\xff\xfe{}", "invalid_utf8"),
        (b'{"body": "\xc3"}', "invalid_utf8"),
    ],
)
def test_lines_that_are_not_json_objects(raw: str | bytes, code: str) -> None:
    assert code_of(raw) == code


def test_duplicate_keys_are_refused() -> None:
    raw = line()[:-1] + ', "turnId": "other"}'
    assert code_of(raw) == "invalid_json"


@pytest.mark.parametrize(
    "changes",
    [
        {"seq": "3"},
        {"seq": True},
        {"seq": 3.0},
        {"seq": [3]},
        {"seq": 0},
        {"seq": -2},
        {"seq": 2**53},
        {"project": 7},
        {"host": None},
        {"host": ""},
        {"thread": ["t"]},
        {"turnId": 12},
        {"body": None},
        {"body": 5},
        {"completedAt": 1767225600},
        {"completedAt": "2026-01-01T00:00:00"},
        {"completedAt": "yesterday"},
        {"completedAt": "2026-02-30T00:00:00Z"},
        {"turnId": _DROP},
        {"body": _DROP},
        {"completedAt": _DROP},
        {"extra": "field"},
        {"turn_id": "snake_case is another key"},
        {"host": "a\u0000b"},
    ],
)
def test_bad_fields_are_invalid_turn(changes: dict[str, object]) -> None:
    assert code_of(line(**changes)) == "invalid_turn"


def test_invalid_project() -> None:
    assert code_of(line(project="")) == "invalid_project"
    assert code_of(line(project="a/..")) == "invalid_project"


def test_field_error_names_the_field_and_not_the_value() -> None:
    with pytest.raises(InputError) as info:
        parse_turn_line(line(seq="secret-3"))
    assert "seq" in info.value.message
    assert "secret-3" not in info.value.message


def test_body_too_large_says_the_limit() -> None:
    with pytest.raises(InputError) as info:
        parse_turn_line(line(body="x" * (MAX_BODY_BYTES + 1)))
    assert info.value.code == "body_too_large"
    assert f"the limit is {MAX_BODY_BYTES} bytes" in info.value.message


def test_body_at_the_limit_fits_even_fully_escaped() -> None:
    raw = line(body="\x01" * MAX_BODY_BYTES)  # every byte escaped as \u0001 by json.dumps
    assert len(raw.encode()) <= MAX_LINE_BYTES
    turn = parse_turn_line(raw.encode())
    assert turn is not None and turn.body_bytes == MAX_BODY_BYTES


def test_a_line_over_the_line_limit() -> None:
    assert code_of(b" " * (MAX_LINE_BYTES + 1)) == "line_too_long"


names = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), min_size=1, max_size=20)


@settings(max_examples=150)
@given(
    project=names.filter(lambda p: p.strip("/.") != ""),
    host=names,
    thread=names,
    turn_id=names,
    body=st.text(st.characters(exclude_categories=("Cs",)), max_size=200),
    seq=st.none() | st.integers(1, 2**53 - 1),
    micros=st.integers(0, 253_402_300_799_999_999),
)
def test_roundtrip_of_valid_fields(
    project: str, host: str, thread: str, turn_id: str, body: str, seq: int | None, micros: int
) -> None:
    try:
        canonical = canonical_project(project)
    except InputError:
        return
    doc = {
        "project": project,
        "host": host,
        "thread": thread,
        "turnId": turn_id,
        "completedAt": format_rfc3339(micros),
        "body": body,
    }
    if seq is not None:
        doc["seq"] = seq  # type: ignore[assignment]
    for ensure_ascii in (True, False):
        turn = parse_turn_line(json.dumps(doc, ensure_ascii=ensure_ascii).encode("utf-8"))
        assert turn is not None
        assert (turn.project, turn.host, turn.thread, turn.turn_id, turn.body, turn.seq) == (
            canonical,
            host,
            thread,
            turn_id,
            body,
            seq,
        )
        assert turn.completed_at_micros == micros


@settings(max_examples=300)
@given(st.binary(max_size=300) | st.text(max_size=200))
def test_any_input_is_a_turn_none_or_an_input_error(raw: bytes | str) -> None:
    try:
        result = parse_turn_line(raw)
    except InputError as exc:
        assert exc.code in {"invalid_json", "invalid_utf8", "invalid_turn", "invalid_project", "body_too_large"}
        return
    assert result is None or isinstance(result, TurnRecord)
