"""The topic's replication on the session's three-node cluster: what throughline creates, what it refuses.

On one broker (tests/integration/test_topic_replication.py) RF 1 and min.insync.replicas 1 are right;
here, with three brokers, a topic throughline creates has three replicas per partition and
``min.insync.replicas=2``, and an existing topic that could lose acknowledged turns is refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from throughline.log.exceptions import LossyTopicReplicationError
from throughline.log.topic import ensure_topic
from throughline.testing.kafka.cluster import KafkaCluster

pytestmark = pytest.mark.integration

CLI = str(Path(sys.executable).with_name("throughline"))
KEEPS = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}


def test_a_topic_throughline_creates_on_three_brokers_has_three_replicas_and_min_isr_two(
    kafka_cluster: KafkaCluster, kafka_topic_name: str, tmp_path: Path
) -> None:
    info = ensure_topic(kafka_cluster.bootstrap_servers, kafka_topic_name, partitions=3)
    assert info.created and info.brokers == 3
    assert [len(r.replicas) for r in info.replicas] == [3, 3, 3]
    assert info.configs["min.insync.replicas"] == "2"
    assert info.configs["unclean.leader.election.enable"] == "false"
    assert info.replication_reasons == ()
    env = {
        **os.environ,
        "THROUGHLINE_BOOTSTRAP_SERVERS": kafka_cluster.bootstrap_servers,
        "THROUGHLINE_TOPIC": kafka_topic_name,
    }
    db = str(tmp_path / "p.duckdb")
    for args in (["project", "--until-caught-up"], ["status", "--json"]):
        status = subprocess.run(
            [CLI, *args, "--db", db], env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert status.returncode == 0, status.stderr
    rows = json.loads(status.stdout)["partitions"]
    assert [(len(r["replicas"]), len(r["isr"]), r["underReplicated"]) for r in rows] == [(3, 3, False)] * 3
    assert all(r["leader"] in r["replicas"] for r in rows)


@pytest.mark.parametrize(
    ("replicas", "configs", "why"),
    [
        (1, KEEPS, "replication factor"),
        (3, {**KEEPS, "min.insync.replicas": "1"}, "min.insync.replicas"),
        (3, {**KEEPS, "min.insync.replicas": "2", "unclean.leader.election.enable": "true"}, "unclean"),
    ],
)
def test_an_existing_topic_that_could_lose_acknowledged_turns_is_refused_unless_allowed(
    kafka_cluster: KafkaCluster, kafka_topic_name: str, replicas: int, configs: dict[str, str], why: str
) -> None:
    kafka_cluster.create_topic(kafka_topic_name, partitions=1, replication_factor=replicas, configs=configs)
    with pytest.raises(LossyTopicReplicationError) as refused:
        ensure_topic(kafka_cluster.bootstrap_servers, kafka_topic_name, partitions=1)
    assert refused.value.code == "lossy_topic_replication" and why in str(refused.value)
    info = ensure_topic(kafka_cluster.bootstrap_servers, kafka_topic_name, partitions=1, allow_lossy=True)
    assert not info.created and info.replication_reasons
