"""The topic's replication against the real session broker (one broker): what ``ensure_topic`` creates,
what it refuses, the overrides, and what ``status`` and ``/readyz`` show.

On one broker the right replication is RF 1 and ``min.insync.replicas`` 1 (``min(3, 1)``, ``min(2, 1)``);
the three-broker cases (RF 3 / min ISR 2, a short RF refused) need a cluster fixture and are not here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka.admin import ConfigResource, ConfigResourceType
from support.topic import read_topic, turn_ids
from test_serve import Serve

from throughline.log import (
    InvalidReplicationError,
    LossyTopicReplicationError,
    TopicMissingError,
    describe_topic,
    ensure_topic,
)

RUN_TIMEOUT_S = 120.0
UNCLEAN = {"unclean.leader.election.enable": "true", "retention.ms": "-1"}


def cli(bootstrap: str, topic: str, *args: str, db: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "THROUGHLINE_BOOTSTRAP_SERVERS": bootstrap, "THROUGHLINE_TOPIC": topic}
    env.pop("THROUGHLINE_DB", None)
    if db is not None:
        env["THROUGHLINE_DB"] = str(db)
    return subprocess.run(
        [sys.executable, "-m", "throughline.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def error_code(result: subprocess.CompletedProcess[str]) -> str:
    code: str = json.loads(result.stderr.strip().splitlines()[-1])["error"]["code"]
    return code


def turn_line(n: int) -> str:
    return (
        json.dumps(
            {
                "project": "/srv/replication",
                "host": "h",
                "thread": "t",
                "turnId": f"turn-{n:05d}",
                "completedAt": "2026-01-01T00:00:00Z",
                "body": f"body {n}",
            }
        )
        + "\n"
    )


def topic_configs(admin: Any, topic: str) -> dict[str, dict[str, Any]]:
    resource = ConfigResource(
        ConfigResourceType.TOPIC, topic, {"min.insync.replicas": None, "unclean.leader.election.enable": None}
    )
    described: dict[str, dict[str, Any]] = admin.describe_configs([resource], config_filter="all")["topic"][topic]
    return described


def test_a_created_topic_gets_rf_1_and_min_isr_1_on_one_broker(
    kafka_bootstrap: str, kafka_topic_name: str, kafka_admin: Any
) -> None:
    info = ensure_topic(kafka_bootstrap, kafka_topic_name, partitions=2)
    assert info.created and info.brokers == 1
    assert info.replication_factor == 1 and info.min_insync_replicas == 1
    assert [(p.partition, p.leader, p.replicas, p.isr) for p in info.replicas] == [
        (0, 1, (1,), (1,)),
        (1, 1, (1,), (1,)),
    ]
    assert info.replication_reasons == () and info.lossy_reasons == ()
    # Both are the topic's own settings, not the broker's defaults: a broker default changed later
    # cannot weaken the topic.
    configs = topic_configs(kafka_admin, kafka_topic_name)
    assert configs["min.insync.replicas"]["value"] == "1"
    assert configs["min.insync.replicas"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
    assert configs["unclean.leader.election.enable"]["value"] == "false"
    assert configs["unclean.leader.election.enable"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
    assert describe_topic(kafka_bootstrap, kafka_topic_name).replication_json() == {
        "brokers": 1,
        "replicationFactor": 1,
        "minInsyncReplicas": 1,
        "uncleanLeaderElection": False,
        "underReplicated": [],
        "problems": [],
    }


def test_unclean_leader_election_is_refused_unless_allowed(
    kafka_bootstrap: str, kafka_topic_name: str, kafka_create_topic: Callable[..., str]
) -> None:
    kafka_create_topic(kafka_topic_name, partitions=1, configs=UNCLEAN)
    with pytest.raises(LossyTopicReplicationError, match="unclean.leader.election.enable=true") as raised:
        ensure_topic(kafka_bootstrap, kafka_topic_name)
    assert raised.value.code == "lossy_topic_replication"
    allowed = ensure_topic(kafka_bootstrap, kafka_topic_name, allow_lossy=True)
    assert not allowed.created and any("unclean" in r for r in allowed.replication_reasons)


def test_ingest_refuses_an_unclean_topic_with_exit_2_and_accepts_it_with_allow_lossy_topic(
    kafka_bootstrap: str, kafka_topic_name: str, kafka_create_topic: Callable[..., str], tmp_path: Path
) -> None:
    kafka_create_topic(kafka_topic_name, partitions=1, configs=UNCLEAN)
    path = tmp_path / "in.jsonl"
    path.write_text(turn_line(1))
    refused = cli(kafka_bootstrap, kafka_topic_name, "ingest", str(path))
    assert refused.returncode == 2, refused.stderr
    assert error_code(refused) == "lossy_topic_replication"
    allowed = cli(kafka_bootstrap, kafka_topic_name, "ingest", str(path), "--allow-lossy-topic")
    assert allowed.returncode == 0, allowed.stderr
    assert "could lose acknowledged turns" in allowed.stderr  # the warning says what was accepted
    assert turn_ids(read_topic(kafka_bootstrap, kafka_topic_name)) == ["turn-00001"]
    # the projector reads it (the log is what it is) and says so at its start
    projected = cli(kafka_bootstrap, kafka_topic_name, "project", "--until-caught-up", db=tmp_path / "p.duckdb")
    assert projected.returncode == 0, projected.stderr
    assert "could lose acknowledged turns" in projected.stderr and "unclean" in projected.stderr


def test_a_replication_factor_above_the_broker_count_is_an_input_error(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    with pytest.raises(InvalidReplicationError, match="needs 2 brokers but the cluster has 1"):
        ensure_topic(kafka_bootstrap, kafka_topic_name, replication_factor=2)
    with pytest.raises(TopicMissingError):  # refused before anything was created
        describe_topic(kafka_bootstrap, kafka_topic_name)
    path = tmp_path / "in.jsonl"
    path.write_text(turn_line(1))
    for command in (["ingest", str(path)], ["serve", "--port", "0"]):
        result = cli(kafka_bootstrap, kafka_topic_name, *command, "--replication-factor", "2", db=tmp_path / "p.duckdb")
        assert result.returncode == 2, result.stderr
        assert error_code(result) == "invalid_replication"
    assert cli(kafka_bootstrap, kafka_topic_name, "ingest", str(path), "--min-insync-replicas", "2").returncode == 2
    with pytest.raises(TopicMissingError):
        describe_topic(kafka_bootstrap, kafka_topic_name)


def test_explicit_overrides_that_fit_create_the_topic_with_them(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(turn_line(1))
    result = cli(
        kafka_bootstrap,
        kafka_topic_name,
        "ingest",
        str(path),
        "--replication-factor",
        "1",
        "--min-insync-replicas",
        "1",
    )
    assert result.returncode == 0, result.stderr
    info = describe_topic(kafka_bootstrap, kafka_topic_name)
    assert (info.replication_factor, info.min_insync_replicas, info.replication_reasons) == (1, 1, ())


def test_status_shows_each_partitions_replicas(kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    path = tmp_path / "in.jsonl"
    path.write_text(turn_line(1))
    assert cli(kafka_bootstrap, kafka_topic_name, "ingest", str(path), "--partitions", "2").returncode == 0
    projected = cli(kafka_bootstrap, kafka_topic_name, "project", "--until-caught-up", db=db)
    assert projected.returncode == 0, projected.stderr
    status = cli(kafka_bootstrap, kafka_topic_name, "status", "--json", db=db)
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert [
        {k: p[k] for k in ("partition", "leader", "replicas", "isr", "underReplicated")} for p in doc["partitions"]
    ] == [
        {"partition": 0, "leader": 1, "replicas": [1], "isr": [1], "underReplicated": False},
        {"partition": 1, "leader": 1, "replicas": [1], "isr": [1], "underReplicated": False},
    ]
    assert all("lag" in p and "applied" in p for p in doc["partitions"])  # the existing fields stay
    assert doc["replication"]["replicationFactor"] == 1 and doc["replication"]["minInsyncReplicas"] == 1
    table = cli(kafka_bootstrap, kafka_topic_name, "status", db=db).stdout
    assert "replication: factor 1, min.insync.replicas 1, 1 brokers, unclean leader election off" in table
    header = next(line for line in table.splitlines() if line.split()[:1] == ["partition"])
    assert header.split()[-4:] == ["leader", "replicas", "isr", "under-replicated"]


def test_readyz_shows_the_topics_replication(kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path) -> None:
    serve = Serve(kafka_bootstrap, kafka_topic_name, tmp_path / "serve.duckdb", "--partitions", "2").start()
    try:
        report = serve.wait_caught_up()
        assert [
            (p["partition"], p["leader"], p["replicas"], p["isr"], p["underReplicated"]) for p in report["partitions"]
        ] == [
            (0, 1, [1], [1], False),
            (1, 1, [1], [1], False),
        ]
        assert report["replication"] == {
            "brokers": 1,
            "replicationFactor": 1,
            "minInsyncReplicas": 1,
            "uncleanLeaderElection": False,
            "underReplicated": [],
            "problems": [],
        }
        remote = cli(kafka_bootstrap, kafka_topic_name, "status", "--url", serve.url)
        assert "replication: factor 1" in remote.stdout, remote.stderr
    finally:
        assert serve.terminate() == 0, serve.stderr()
