"""The topic's durability policy (``throughline.log.policy``): the replication a new topic gets, what
an existing one is refused for, the overrides and their flags, and how ``status``/``/readyz`` show it.

Pure functions and the in-memory read API: no broker (tests/integration/test_topic_replication.py
runs the same decisions against a real one).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from reader_world import KEY, World

from throughline.cli import build_parser, main
from throughline.commands.options import replication_overrides
from throughline.log import (
    InvalidReplicationError,
    LossyTopicError,
    LossyTopicReplicationError,
    PartitionReplicas,
    TopicInfo,
    TopicSettings,
    check_topic,
    topic_problems,
)
from throughline.log.exceptions import BrokerUnavailableError
from throughline.log.policy import (
    default_replication,
    replication_document,
    replication_lines,
    replication_reasons,
    resolve_replication,
)
from throughline.serve.app import ApiSettings, create_app
from throughline.serve.remote_status import render_remote_status, status_document

KEEPS_ALL = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}
brokers_st = st.integers(min_value=1, max_value=12)


def configs(min_insync: int | None = 2, unclean: str | None = "false", **retention: str) -> dict[str, str]:
    out = {**KEEPS_ALL, **retention}
    if min_insync is not None:
        out["min.insync.replicas"] = str(min_insync)
    if unclean is not None:
        out["unclean.leader.election.enable"] = unclean
    return out


# ------------------------------------------------------------------------------------- new topics


@pytest.mark.parametrize(("brokers", "expected"), [(1, (1, 1)), (2, (2, 2)), (3, (3, 2)), (4, (3, 2)), (9, (3, 2))])
def test_a_new_topic_gets_rf_min_3_brokers_and_min_isr_min_2_rf(brokers: int, expected: tuple[int, int]) -> None:
    assert default_replication(brokers) == expected
    assert resolve_replication(brokers) == expected


def test_overrides_replace_the_defaults_where_the_cluster_can_take_them() -> None:
    assert resolve_replication(5, 5, None) == (5, 2)
    assert resolve_replication(5, None, 3) == (3, 3)
    assert resolve_replication(3, 1, None) == (1, 1)  # min ISR follows a smaller RF
    assert resolve_replication(3, 2, 1) == (2, 1)


@pytest.mark.parametrize(
    ("brokers", "rf", "isr", "says"),
    [
        (1, 2, None, "needs 2 brokers but the cluster has 1"),
        (3, 4, None, "needs 4 brokers"),
        (3, 2, 3, "above --replication-factor 2"),
        (1, None, 2, "above the replication factor 1"),  # the default RF on one broker is 1
        (3, 0, None, "at least 1"),
        (3, None, -1, "at least 1"),
        (3, True, None, "at least 1"),  # a bool is not a count
    ],
)
def test_overrides_the_cluster_cannot_take_are_input_errors(brokers: int, rf: Any, isr: Any, says: str) -> None:
    with pytest.raises(InvalidReplicationError, match=says) as raised:
        resolve_replication(brokers, rf, isr)
    assert raised.value.code == "invalid_replication" and raised.value.exit_code == 2


def test_topic_settings_check_the_overrides_and_turn_unclean_election_off() -> None:
    settings = TopicSettings(partitions=3, replication_factor=3, min_insync_replicas=2)
    assert settings.configs()["unclean.leader.election.enable"] == "false"
    assert settings.configs()["retention.ms"] == "-1"
    assert settings.replication(5) == (3, 2)
    with pytest.raises(InvalidReplicationError):
        settings.replication(2)  # RF 3 on two brokers
    with pytest.raises(InvalidReplicationError):
        TopicSettings(replication_factor=2, min_insync_replicas=3)
    with pytest.raises(InvalidReplicationError):
        TopicSettings(min_insync_replicas=0)


@given(brokers_st, st.none() | st.integers(1, 12), st.none() | st.integers(1, 12))
def test_what_throughline_creates_passes_its_own_check(brokers: int, rf: int | None, isr: int | None) -> None:
    """A topic created as ``resolve_replication`` says is never refused by the same command later, and
    one created without overrides passes the default bar (any command, the hook included)."""
    want_rf = min(3, brokers) if rf is None else rf
    want_isr = min(2, want_rf) if isr is None else isr
    if want_rf > brokers or want_isr > want_rf:
        with pytest.raises(InvalidReplicationError):
            resolve_replication(brokers, rf, isr)
        return
    made_rf, made_isr = resolve_replication(brokers, rf, isr)
    assert (made_rf, made_isr) == (want_rf, want_isr)
    assert 1 <= made_isr <= made_rf <= brokers
    reasons = replication_reasons(
        brokers, [made_rf] * 3, made_isr, False, replication_factor=rf, min_insync_replicas=isr
    )
    assert reasons == ()
    if rf is None and isr is None:
        assert replication_reasons(brokers, [made_rf] * 3, made_isr, False) == ()


# ------------------------------------------------------------------------------- existing topics


@pytest.mark.parametrize(
    ("brokers", "factors", "min_insync", "unclean", "problem"),
    [
        (1, [1, 1, 1], 1, False, None),  # the one-broker dev cluster: RF 1 / min ISR 1 is right there
        (3, [3, 3, 3], 2, False, None),
        (5, [3, 3, 3], 2, False, None),
        (2, [2, 2], 2, False, None),
        (3, [1, 1, 1], 1, False, "replication factor 1 below 3"),
        (3, [3, 2, 3], 2, False, "replication factor 2 below 3"),  # one partition short is enough
        (2, [1, 1], 1, False, "replication factor 1 below 2"),
        (3, [3, 3, 3], 1, False, "min.insync.replicas=1 below 2"),
        (2, [2, 2], 1, False, "min.insync.replicas=1 below 2"),
        (1, [1], 1, True, "unclean.leader.election.enable=true"),
        (3, [3, 3, 3], 2, True, "unclean.leader.election.enable=true"),
        (3, [3, 3, 3], None, False, "min.insync.replicas was not reported"),
        (3, [3, 3, 3], 2, None, "unclean.leader.election.enable was not reported"),
    ],
)
def test_replication_that_could_lose_acknowledged_turns(
    brokers: int, factors: list[int], min_insync: int | None, unclean: bool | None, problem: str | None
) -> None:
    reasons = replication_reasons(brokers, factors, min_insync, unclean)
    if problem is None:
        assert reasons == ()
    else:
        assert any(problem in r for r in reasons), reasons


def test_explicit_overrides_set_the_bar_of_the_check() -> None:
    # --replication-factor 2 on three brokers: the operator's choice, accepted; the default bar refuses it.
    assert replication_reasons(3, [2, 2], 2, False, replication_factor=2) == ()
    assert replication_reasons(3, [2, 2], 2, False) != ()
    # --min-insync-replicas 3 asks more than the default: a min ISR of 2 now falls short.
    assert any("below 3" in r for r in replication_reasons(5, [5], 2, False, min_insync_replicas=3))


@given(
    brokers_st,
    st.lists(st.integers(1, 12), min_size=1, max_size=6),
    st.integers(1, 12),
    st.booleans(),
)
def test_the_reasons_are_exactly_the_three_rules(brokers: int, factors: list[int], isr: int, unclean: bool) -> None:
    reasons = replication_reasons(brokers, factors, isr, unclean)
    rf_short = min(factors) < min(3, brokers)
    isr_short = isr < min(2, min(factors))
    assert any("replication factor" in r for r in reasons) == rf_short
    assert any("min.insync.replicas" in r for r in reasons) == isr_short
    assert any("unclean" in r for r in reasons) == unclean
    assert len(reasons) == rf_short + isr_short + unclean


@given(brokers_st, st.integers(1, 12), st.integers(1, 12))
def test_more_replicas_never_add_a_reason(brokers: int, rf: int, isr: int) -> None:
    fewer = set(replication_reasons(brokers, [rf], min(isr, rf), False))
    more = replication_reasons(brokers, [rf + 1], min(isr + 1, rf + 1), False)
    assert len(more) <= len(fewer)


def test_topic_problems_keeps_retention_and_replication_apart() -> None:
    assert not topic_problems(1, [1], configs(min_insync=1))
    both = topic_problems(3, [1], configs(min_insync=1, **{"retention.ms": "604800000"}))
    assert both and any("retention.ms" in r for r in both.retention)
    assert any("replication factor" in r for r in both.replication)
    only_unclean = topic_problems(1, [1], configs(min_insync=1, unclean="true"))
    assert only_unclean.retention == () and len(only_unclean.replication) == 1
    assert topic_problems(1, [1], configs(min_insync=1, unclean="TRUE")).replication  # the broker's case varies


def _info(brokers: int, factors: list[int], **conf: Any) -> TopicInfo:
    replicas = tuple(
        PartitionReplicas(p, 1, tuple(range(1, n + 1)), tuple(range(1, n + 1))) for p, n in enumerate(factors)
    )
    return TopicInfo("t", len(factors), configs(**conf), brokers=brokers, replicas=replicas)


def test_check_topic_refuses_retention_first_then_replication_unless_allowed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    check_topic(_info(1, [1], min_insync=1))  # nothing to say
    with pytest.raises(LossyTopicReplicationError) as raised:
        check_topic(_info(3, [1, 1], min_insync=1))
    assert raised.value.code == "lossy_topic_replication" and raised.value.exit_code == 2
    assert isinstance(raised.value, LossyTopicError)  # callers catching the lossy topic catch this one too
    assert "replication factor 1 below 3" in raised.value.message and "--allow-lossy-topic" in raised.value.message
    with pytest.raises(LossyTopicError) as retention:
        check_topic(_info(3, [1], min_insync=1, **{"cleanup.policy": "compact"}))
    assert retention.value.code == "lossy_topic"
    with caplog.at_level("WARNING", logger="throughline.log.topic"):
        check_topic(_info(3, [1], min_insync=1, unclean="true"), allow_lossy=True)
    assert "could lose acknowledged turns" in caplog.text and "unclean" in caplog.text
    check_topic(_info(3, [2], min_insync=2), replication_factor=2)  # the operator's bar
    assert TopicInfo("t", 1, configs()).replication_reasons == ()  # not described: nothing to judge


# ---------------------------------------------------------------------------------- what is shown


def test_a_partition_is_under_replicated_when_its_isr_is_short() -> None:
    full = PartitionReplicas(0, 1, (1, 2, 3), (1, 2, 3))
    behind = PartitionReplicas(1, 1, (1, 2, 3), (1, 2))
    alone = PartitionReplicas(2, None, (1,), (1,))
    assert not full.under_replicated(2) and behind.under_replicated(2)
    assert alone.under_replicated(2)  # fewer in sync than min.insync.replicas: acks=all writes fail
    assert not alone.under_replicated(1)
    assert behind.to_json(2) == {"leader": 1, "replicas": [1, 2, 3], "isr": [1, 2], "underReplicated": True}
    assert alone.to_json(1)["leader"] is None
    doc = replication_document(3, [full, behind], configs(), ())
    assert doc == {
        "brokers": 3,
        "replicationFactor": 3,
        "minInsyncReplicas": 2,
        "uncleanLeaderElection": False,
        "underReplicated": [1],
        "problems": [],
    }
    line = replication_lines(doc)[0]
    assert "factor 3, min.insync.replicas 2, 3 brokers, unclean leader election off" in line
    assert line.endswith("under-replicated partitions: 1")


def _behind_topic() -> TopicInfo:
    replicas = (PartitionReplicas(0, 2, (2, 1, 3), (2, 1)),)
    return TopicInfo("t", 1, configs(), brokers=3, replicas=replicas)


def test_readyz_shows_replication_without_changing_readiness(http_world: World) -> None:
    app = create_app(
        projection=http_world.projection,
        log=http_world.log,
        token_key=KEY,
        settings=ApiSettings(read_wait=0.0),
        replication=_behind_topic,
    )
    with TestClient(app) as client:
        answer = client.get("/readyz")
    assert answer.status_code == 200  # under-replicated is an alarm, not a reason to stop answering reads
    report = answer.json()
    assert report["partitions"] == [
        {
            "partition": 0,
            "appliedOffset": 3,
            "endOffset": 3,
            "lag": 0,
            "leader": 2,
            "replicas": [2, 1, 3],
            "isr": [2, 1],
            "underReplicated": True,
        }
    ]
    assert report["replication"]["replicationFactor"] == 3 and report["replication"]["minInsyncReplicas"] == 2
    assert report["replication"]["underReplicated"] == [0] and report["replication"]["problems"] == []
    text = render_remote_status(status_document("http://127.0.0.1:1", 200, report))
    assert "under-replicated partitions: 0" in text
    assert text.splitlines()[-1].split() == ["0", "3", "3", "0", "2", "2,1,3", "2,1", "yes"]


def test_readyz_reports_a_replication_it_cannot_describe(http_world: World) -> None:
    def failing() -> TopicInfo:
        raise BrokerUnavailableError(["127.0.0.1:1"], "no broker answered")

    app = create_app(
        projection=http_world.projection,
        log=http_world.log,
        token_key=KEY,
        settings=ApiSettings(read_wait=0.0),
        replication=failing,
    )
    with TestClient(app) as client:
        answer = client.get("/readyz")
    assert answer.status_code == 200
    assert answer.json()["replicationError"]["code"] == "broker_unavailable"
    assert "replication" not in answer.json()


# ------------------------------------------------------------------------------------------ flags


@pytest.mark.parametrize("command", [["ingest", "f.jsonl"], ["serve"]])
def test_the_flags_are_accepted_where_partitions_is(command: list[str]) -> None:
    args = build_parser().parse_args([*command, "--replication-factor", "3", "--min-insync-replicas", "2"])
    assert (args.replication_factor, args.min_insync_replicas) == (3, 2)
    assert replication_overrides(args) == (3, 2)
    defaults = build_parser().parse_args(command)
    assert (defaults.replication_factor, defaults.min_insync_replicas) == (None, None)


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_a_flag_below_one_is_an_argument_error(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["ingest", "f.jsonl", "--replication-factor", value])
    assert exited.value.code == 2
    assert json.loads(capsys.readouterr().err.splitlines()[-1])["error"]["code"] == "invalid_arguments"


@pytest.mark.parametrize("command", [["ingest", "-"], ["serve", "--port", "0"]])
def test_a_min_isr_above_the_rf_is_refused_before_connecting(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Nothing listens on port 1: had the command connected first, the error would be the broker's.
    code = main(
        [
            *command,
            "--bootstrap-servers",
            "127.0.0.1:1",
            "--replication-factor",
            "2",
            "--min-insync-replicas",
            "3",
        ]
    )
    assert code == 2
    assert json.loads(capsys.readouterr().err.splitlines()[-1])["error"]["code"] == "invalid_replication"
