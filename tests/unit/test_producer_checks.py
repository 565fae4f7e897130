"""What the producer checks before anything is sent (no broker needed for these)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta, timezone

import pytest

from throughline.core.exceptions import InvalidTurnError
from throughline.core.turn import build_turn, parse_rfc3339
from throughline.log import TopicInfo, bootstrap_list, lossy_reasons
from throughline.producers.producer import checked_turn, completed_at_micros

TURN = build_turn(project="/p", host="h", thread="t", turn_id="x", completed_at_micros=0, body="b")


def test_completed_at_accepts_aware_datetimes_rfc3339_and_micros() -> None:
    expected = parse_rfc3339("2026-01-01T00:00:00Z")
    assert completed_at_micros(datetime(2026, 1, 1, tzinfo=UTC)) == expected
    assert completed_at_micros(datetime(2026, 1, 1, 9, tzinfo=timezone(timedelta(hours=9)))) == expected
    assert completed_at_micros("2026-01-01T00:00:00Z") == expected
    assert completed_at_micros(expected) == expected


@pytest.mark.parametrize("value", [datetime(2026, 1, 1), "2026-01-01", True, 1.5, None])
def test_completed_at_refuses_the_rest(value: object) -> None:
    with pytest.raises(InvalidTurnError):
        completed_at_micros(value)  # type: ignore[arg-type]


def test_checked_turn_accepts_a_built_turn() -> None:
    assert checked_turn(TURN) is TURN


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"body": "tampered"}, "contentDigest"),
        ({"project": "/p/"}, "canonical"),
        ({"project_sha256": bytes(32)}, "projectSha256"),
        ({"turn_id": ""}, "turnId"),
        ({"seq": 0}, "seq"),
        ({"producer": dataclasses.replace(TURN.producer, attributes={"k": 1})}, "attributes"),
    ],
)
def test_checked_turn_refuses_an_unsound_turn(changes: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidTurnError, match=match):
        checked_turn(dataclasses.replace(TURN, **changes))  # type: ignore[arg-type]


def test_checked_turn_needs_a_turn_record() -> None:
    with pytest.raises(InvalidTurnError):
        checked_turn({"project": "/p"})  # type: ignore[arg-type]


def test_bootstrap_list() -> None:
    assert bootstrap_list("a:1, b:2,,") == ["a:1", "b:2"]
    assert bootstrap_list(["a:1", "b:2,c:3"]) == ["a:1", "b:2", "c:3"]
    with pytest.raises(Exception, match="bootstrap"):
        bootstrap_list(" , ")


@pytest.mark.parametrize(
    ("configs", "lossy"),
    [
        ({"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}, False),
        ({"retention.ms": "604800000", "retention.bytes": "-1", "cleanup.policy": "delete"}, True),
        ({"retention.ms": "-1", "retention.bytes": "0", "cleanup.policy": "delete"}, True),
        ({"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete,compact"}, True),
        ({"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "Compact"}, True),
        ({"retention.ms": "-1", "cleanup.policy": "delete"}, True),  # unreported means unchecked
        ({}, True),
    ],
)
def test_lossy_reasons(configs: dict[str, str], lossy: bool) -> None:
    assert bool(lossy_reasons(configs)) is lossy
    assert bool(TopicInfo("t", 1, configs).lossy_reasons) is lossy
