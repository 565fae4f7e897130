"""Turn records: RFC 3339 times, field validation, the body limit and verification after decoding."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from throughline.core.chain import content_digest, micros_since_epoch
from throughline.core.exceptions import BodyTooLargeError, InvalidProjectError, InvalidTurnError
from throughline.core.identity import project_sha256
from throughline.core.turn import (
    MAX_BODY_BYTES,
    MAX_COMPLETED_AT_MICROS,
    MAX_SEQ,
    MIN_COMPLETED_AT_MICROS,
    TurnRecord,
    build_turn,
    format_rfc3339,
    parse_rfc3339,
    verify_turn,
)

EPOCH_2026 = micros_since_epoch(datetime(2026, 1, 1, tzinfo=UTC))


def turn(**overrides: object) -> TurnRecord:
    fields: dict[str, object] = {
        "project": "/work/app",
        "host": "host-a",
        "thread": "thread-1",
        "turn_id": "t1",
        "completed_at_micros": EPOCH_2026,
        "body": "hello",
    }
    fields.update(overrides)
    return build_turn(**fields)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- RFC 3339


@given(st.integers(MIN_COMPLETED_AT_MICROS, MAX_COMPLETED_AT_MICROS))
def test_format_then_parse_roundtrips(micros: int) -> None:
    text = format_rfc3339(micros)
    assert text.endswith("Z") and len(text) == len("2026-01-01T00:00:00.000000Z")
    assert parse_rfc3339(text) == micros


def test_format_pads_small_years() -> None:
    assert format_rfc3339(MIN_COMPLETED_AT_MICROS) == "0001-01-01T00:00:00.000000Z"
    assert format_rfc3339(MAX_COMPLETED_AT_MICROS) == "9999-12-31T23:59:59.999999Z"
    assert format_rfc3339(0) == "1970-01-01T00:00:00.000000Z"
    assert format_rfc3339(-1) == "1969-12-31T23:59:59.999999Z"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-01T00:00:00Z", "2026-01-01T00:00:00.000000Z"),
        ("2026-01-01T02:00:00+02:00", "2026-01-01T00:00:00.000000Z"),
        ("2025-12-31T18:30:00-05:30", "2026-01-01T00:00:00.000000Z"),
        ("2026-01-01T00:00:00+00:00", "2026-01-01T00:00:00.000000Z"),
        ("2026-01-01T00:00:00-00:00", "2026-01-01T00:00:00.000000Z"),
        ("2026-01-01t00:00:00z", "2026-01-01T00:00:00.000000Z"),
        ("2026-01-01 00:00:00Z", "2026-01-01T00:00:00.000000Z"),
        ("2026-01-01T00:00:00.5Z", "2026-01-01T00:00:00.500000Z"),
        ("2026-01-01T00:00:00.123456789Z", "2026-01-01T00:00:00.123456Z"),  # truncated, never rounded up
        ("2026-01-01T00:00:00.999999999Z", "2026-01-01T00:00:00.999999Z"),
        ("2016-12-31T23:59:60Z", "2016-12-31T23:59:59.999999Z"),  # a leap second stays in its second
        ("2024-02-29T12:00:00Z", "2024-02-29T12:00:00.000000Z"),
        ("0001-01-01T00:00:00Z", "0001-01-01T00:00:00.000000Z"),
    ],
)
def test_parse_rfc3339(text: str, expected: str) -> None:
    assert format_rfc3339(parse_rfc3339(text)) == expected


@pytest.mark.parametrize(
    "text",
    [
        "2026-01-01T00:00:00",  # no zone
        "2026-01-01",
        "2026-1-1T00:00:00Z",
        "2026-13-01T00:00:00Z",
        "2026-02-30T00:00:00Z",
        "2025-02-29T00:00:00Z",
        "2026-01-01T24:00:00Z",
        "2026-01-01T00:60:00Z",
        "2026-01-01T00:00:61Z",
        "2026-01-01T00:00:00+24:00",
        "2026-01-01T00:00:00+01:60",
        "2026-01-01T00:00:00+0100",
        "2026-01-01T00:00:00.Z",
        "0000-01-01T00:00:00Z",
        "0001-01-01T00:00:00+01:00",  # before year 1 in UTC
        "9999-12-31T23:59:59-01:00",  # after year 9999 in UTC
        " 2026-01-01T00:00:00Z",
        "2026-01-01T00:00:00Z ",
        "2026-01-01T00:00:00Z\n",
        "２０２６-01-01T00:00:00Z",  # non-ASCII digits
        "",
    ],
)
def test_invalid_rfc3339(text: str) -> None:
    with pytest.raises(InvalidTurnError) as info:
        parse_rfc3339(text)
    assert info.value.code == "invalid_turn"


@pytest.mark.parametrize("value", [None, 0, 1.5, b"2026-01-01T00:00:00Z", datetime(2026, 1, 1, tzinfo=UTC)])
def test_parse_rfc3339_needs_a_string(value: object) -> None:
    with pytest.raises(InvalidTurnError):
        parse_rfc3339(value)


# ---------------------------------------------------------------------------------------------- build


def test_build_turn_canonicalises_and_digests() -> None:
    t = turn(project="/work//app/", seq=2)
    assert t.project == "/work/app"
    assert t.project_sha256 == project_sha256("/work/app")
    assert t.content_digest == content_digest("t1", EPOCH_2026, "hello")
    assert t.seq == 2
    assert t.body_bytes == 5
    assert verify_turn(t) is None


def test_body_at_the_limit_is_accepted() -> None:
    assert turn(body="x" * MAX_BODY_BYTES).body_bytes == MAX_BODY_BYTES


def test_body_over_the_limit_is_refused_with_the_limit() -> None:
    with pytest.raises(BodyTooLargeError) as info:
        turn(body="x" * (MAX_BODY_BYTES + 1))
    assert info.value.code == "body_too_large"
    assert str(MAX_BODY_BYTES) in info.value.message
    assert str(MAX_BODY_BYTES + 1) in info.value.message


def test_body_limit_counts_utf8_bytes_not_characters() -> None:
    snowmen = "☃" * (MAX_BODY_BYTES // 3 + 1)  # 3 bytes each
    assert len(snowmen) < MAX_BODY_BYTES
    with pytest.raises(BodyTooLargeError):
        turn(body=snowmen)


def test_body_with_a_lone_surrogate_is_refused() -> None:
    with pytest.raises(InvalidTurnError):
        turn(body="a\ud800b")


@pytest.mark.parametrize("seq", [0, -1, MAX_SEQ + 1, True, "3", 3.0])
def test_invalid_seq(seq: object) -> None:
    with pytest.raises(InvalidTurnError, match="seq"):
        turn(seq=seq)


@pytest.mark.parametrize("seq", [None, 1, MAX_SEQ])
def test_valid_seq(seq: int | None) -> None:
    assert turn(seq=seq).seq == seq


@pytest.mark.parametrize(
    "value", [True, 1.0, "2026-01-01T00:00:00Z", MIN_COMPLETED_AT_MICROS - 1, MAX_COMPLETED_AT_MICROS + 1, 2**63]
)
def test_invalid_completed_at(value: object) -> None:
    with pytest.raises(InvalidTurnError, match="completedAt"):
        turn(completed_at_micros=value)


@pytest.mark.parametrize(("field", "value"), [("host", ""), ("thread", None), ("turn_id", "a\x00"), ("body", b"bytes")])
def test_invalid_fields(field: str, value: object) -> None:
    with pytest.raises(InvalidTurnError):
        turn(**{field: value})


def test_invalid_project() -> None:
    with pytest.raises(InvalidProjectError):
        turn(project="")


# ---------------------------------------------------------------------------------------------- verify


def test_verify_turn_catches_tampering() -> None:
    t = turn()
    assert verify_turn(dataclasses.replace(t, body="forged")) == "contentDigest does not match the turn's content"
    assert verify_turn(dataclasses.replace(t, project="/work/app/")) == "project is not in canonical form"
    assert verify_turn(dataclasses.replace(t, project_sha256=bytes(32))) == "projectSha256 does not match the project"
    assert verify_turn(dataclasses.replace(t, seq=0)) is not None
    problem = verify_turn(dataclasses.replace(t, body="x" * (MAX_BODY_BYTES + 1)))
    assert problem is not None and problem.startswith("body_too_large")


def test_producer_fields_are_not_content() -> None:
    a = turn()
    b = turn(producer_name="other", producer_version="9", produced_at_micros=5, attributes={"k": "v"})
    assert a.content_digest == b.content_digest
    assert verify_turn(b) is None
