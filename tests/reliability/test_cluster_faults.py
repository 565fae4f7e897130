"""Cluster faults: leader failovers, a lost quorum, a controller change and a rolling restart.

Every other reliability test runs on one broker, where no leader ever moves. These run on the
session's three-node KRaft cluster (the harness's ``kafka_cluster``: each node a broker and a
controller) with a topic of three replicas and ``min.insync.replicas=2``, created explicitly. In each,
two library producers (``acks=all``, idempotent, a failed turn retried until acknowledged), ``serve``
projecting and the Observer auditing one project run while the fault happens (``cluster_support``):

(a) the leader of the busiest partition is SIGKILLed and started again, ``THROUGHLINE_CLUSTER_LEADER_KILLS``
    times (default 3);
(b) two of the three nodes are SIGKILLed: a send fails with a typed, retriable error within the send
    timeout, nothing is acknowledged while they are down, and everything resumes when they return;
(c) the active controller is SIGKILLed (``THROUGHLINE_CLUSTER_CONTROLLER_KILLS`` times, default 2) and
    another node takes over;
(d) a rolling restart: every node in turn stopped (SIGTERM) and started again;
(e) after leader failovers, two nodes are killed while health checks keep asking ``/readyz``, and
    ``serve`` is sent SIGTERM 12 s later (every log request it makes now waits out its timeout): it exits
    0 within the shutdown bound, and its projection file opens afterwards and holds exactly the log
    prefix its applied offsets name. (Before the fix its readers queued one 10 s timeout each behind
    the log view's lock, and closing waited for all of them: more than 90 s with 12 callers.)

Afterwards (a-d): no acknowledged turn lost, none live twice in the projection (a turn the log holds
twice is applied once), the projection equals a fold of the whole log, and the Observer's audit trail
is exactly the observed project's chain, each turn once, in order. ``serve`` exits within the bound.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import rel_support
from cluster_support import PARTITIONS, SEND_TIMEOUT_S, SHUTDOWN_BOUND_S, ClusterWorld
from rel_support import check_applied_prefix, wait_until

from throughline.errors import ThroughlineError
from throughline.producers.producer import RESULT_GRACE_S, TurnProducer
from throughline.testing.kafka.cluster import KafkaCluster

pytestmark = pytest.mark.integration

LEADER_KILLS = rel_support.env_int("THROUGHLINE_CLUSTER_LEADER_KILLS", 3)
CONTROLLER_KILLS = rel_support.env_int("THROUGHLINE_CLUSTER_CONTROLLER_KILLS", 2)
#: Traffic between faults, in acknowledged turns.
STEADY_TURNS = rel_support.env_int("THROUGHLINE_CLUSTER_STEADY_TURNS", 40)
QUORUM_OUTAGE_S = rel_support.env_float("THROUGHLINE_CLUSTER_QUORUM_OUTAGE", 12.0)
#: Concurrent /readyz callers while serve is stopped with two nodes down, and how long after the kills.
HEALTH_POLLERS = rel_support.env_int("THROUGHLINE_CLUSTER_HEALTH_POLLERS", 12)
SIGTERM_AFTER_S = 12.0


@pytest.fixture
def world(kafka_cluster: KafkaCluster, kafka_topic_name: str, tmp_path: Path) -> Iterator[ClusterWorld]:
    w = ClusterWorld(kafka_cluster, kafka_topic_name, tmp_path)
    try:
        yield w
    finally:
        w.close()
        kafka_cluster.start()  # whatever a failure left down is back for the next test


def _new_leader(cluster: KafkaCluster, topic: str, partition: int, victim: int) -> int:
    """Wait (bounded) until another node leads ``partition``; that node."""

    def moved() -> int | None:
        leader = cluster.leader_of(topic, partition)
        return leader if leader >= 0 and leader != victim else None

    return int(wait_until(moved, timeout=60, interval=0.2, what=f"a leader other than {victim}"))


def test_leader_kills_lose_nothing(world: ClusterWorld, kafka_cluster: KafkaCluster) -> None:
    world.start()
    world.wait_progress(STEADY_TURNS)
    failovers = []
    partition = world.busy_partition()
    for _ in range(LEADER_KILLS):
        victim = kafka_cluster.leader_of(world.topic, partition)
        began = time.monotonic()
        kafka_cluster.kill(victim)
        successor = _new_leader(kafka_cluster, world.topic, partition, victim)
        failovers.append(round(time.monotonic() - began, 1))
        world.mark(f"leader {victim} of partition {partition} killed; {successor} leads")
        world.wait_progress(STEADY_TURNS // 2)  # acknowledged with a replica down (ISR of two)
        kafka_cluster.start_node(victim)
        kafka_cluster.wait_healthy()
        world.mark(f"node {victim} back, every partition fully in sync")
        world.wait_progress(STEADY_TURNS // 2)
    counts = world.finish()
    rel_support.record("cluster", "leader_kills", kills=LEADER_KILLS, failover_seconds=failovers, **counts)


def test_two_nodes_down_refuse_with_a_typed_error(world: ClusterWorld, kafka_cluster: KafkaCluster) -> None:
    world.start()
    world.wait_progress(STEADY_TURNS)
    # A producer that reached the cluster before the outage: its send during the outage is the probe.
    probe = TurnProducer(
        world.bootstrap, world.topic, partitions=PARTITIONS, send_timeout=SEND_TIMEOUT_S, connect_timeout=5.0
    )
    partition = world.busy_partition()
    survivor = kafka_cluster.leader_of(world.topic, partition)  # the busiest partition's leader stays up
    down = [n for n in kafka_cluster.node_ids if n != survivor]
    try:
        for node in down:
            kafka_cluster.kill(node)
        both_down = time.monotonic()
        world.mark(f"nodes {down} killed; {survivor} alone")
        turn = world.senders[0].workload.next_turn("/srv/cluster/probe")
        started = time.monotonic()
        with pytest.raises(ThroughlineError) as refused:
            probe.send(turn)
        took = time.monotonic() - started
        assert refused.value.retriable, refused.value.to_json()
        # The send timeout runs from the send; the grace is the producer's own (RESULT_GRACE_S) plus a second.
        # (This probe's first send also waits for the topic's metadata, and its producer for a producer id
        # no broker hands out without a controller quorum: 15.8 s here before the bound ran from the send.)
        assert took <= SEND_TIMEOUT_S + RESULT_GRACE_S + 1.0, (
            f"the refusal took {took:.1f}s (send timeout {SEND_TIMEOUT_S:g}s)"
        )
        world.mark(f"probe refused after {took:.1f}s: {refused.value.code}")
        time.sleep(max(0.0, QUORUM_OUTAGE_S - (time.monotonic() - both_down)))
        back = time.monotonic()
        # Nothing acknowledged while two of three were down (one second's grace for answers in flight).
        during = [a for a in world.acked() if both_down + 1.0 <= a[3] <= back]
        assert not during, f"{len(during)} turns acknowledged with two of three nodes down: {during[:3]}"
        for node in down:
            kafka_cluster.start_node(node)
        kafka_cluster.wait_healthy()
        world.mark(f"nodes {down} back")
    finally:
        try:
            probe.close(timeout=1.0)
        except ThroughlineError:
            pass
    world.wait_progress(STEADY_TURNS)
    # The refused probe turn may still be in the log: the lone leader appended it before the others came
    # back and copied it (Kafka's "failed but written"); nothing counts it as acknowledged, and a retry of
    # it would be applied once.
    counts = world.finish()
    rel_support.record(
        "cluster",
        "two_nodes_down",
        outage_seconds=QUORUM_OUTAGE_S,
        refused_after_seconds=round(took, 1),
        refused_code=refused.value.code,
        acknowledged_during_outage=0,
        **counts,
    )


def test_controller_kills_lose_nothing(world: ClusterWorld, kafka_cluster: KafkaCluster) -> None:
    world.start()
    world.wait_progress(STEADY_TURNS)
    elections = []
    for _ in range(CONTROLLER_KILLS):
        controller = kafka_cluster.wait_controller()
        began = time.monotonic()
        kafka_cluster.kill(controller)
        successor = kafka_cluster.wait_controller(other_than=controller)
        elections.append(round(time.monotonic() - began, 1))
        world.mark(f"controller {controller} killed; {successor} is the active controller")
        world.wait_progress(STEADY_TURNS // 2)
        kafka_cluster.start_node(controller)
        kafka_cluster.wait_healthy()
        world.wait_progress(STEADY_TURNS // 2)
    counts = world.finish()
    rel_support.record("cluster", "controller_kills", kills=CONTROLLER_KILLS, election_seconds=elections, **counts)


def test_rolling_restart_loses_nothing(world: ClusterWorld, kafka_cluster: KafkaCluster) -> None:
    world.start()
    world.wait_progress(STEADY_TURNS)
    for node in kafka_cluster.node_ids:
        kafka_cluster.stop(node)
        world.mark(f"node {node} stopped")
        world.wait_progress(STEADY_TURNS // 2)
        kafka_cluster.start_node(node)
        kafka_cluster.wait_healthy()
        world.mark(f"node {node} back")
    world.wait_progress(STEADY_TURNS)
    counts = world.finish()
    rel_support.record("cluster", "rolling_restart", restarts=len(kafka_cluster.node_ids), **counts)


def test_serve_stops_within_the_bound_after_failovers(world: ClusterWorld, kafka_cluster: KafkaCluster) -> None:
    world.start()
    world.wait_progress(STEADY_TURNS)
    partition = world.busy_partition()
    for _ in range(2):  # leader failovers under serve
        victim = kafka_cluster.leader_of(world.topic, partition)
        kafka_cluster.kill(victim)
        _new_leader(kafka_cluster, world.topic, partition, victim)
        kafka_cluster.start_node(victim)
        kafka_cluster.wait_healthy()
        world.wait_progress(STEADY_TURNS // 2)
    # Health checks, as a load balancer sends them, keep asking /readyz (each asks the log for its ends).
    pollers = Pollers(world.url, HEALTH_POLLERS).start()
    # Two nodes down: partitions without a leader, and every log request of serve waits out its timeout.
    survivor = kafka_cluster.leader_of(world.topic, partition)
    down = [n for n in kafka_cluster.node_ids if n != survivor]
    for node in down:
        kafka_cluster.kill(node)
    time.sleep(SIGTERM_AFTER_S)
    try:
        took = world.stop_serve()  # exit 0 within the bound (else its stacks are in the failure)
    finally:
        pollers.stop()
    world.mark(f"serve stopped {took:.1f}s after SIGTERM, nodes {down} down, {HEALTH_POLLERS} health pollers")
    for s in world.senders:
        s.stop.set()
    for node in down:
        kafka_cluster.start_node(node)
    kafka_cluster.wait_healthy()
    # The file opens (nobody holds it) and holds exactly the log prefix its applied offsets name.
    applied = check_applied_prefix(world.bootstrap, world.topic, world.db, PARTITIONS)
    assert sum(applied.values()) > 0
    rel_support.record(
        "cluster",
        "serve_shutdown_after_failovers",
        shutdown_seconds=round(took, 1),
        bound_seconds=SHUTDOWN_BOUND_S,
        health_pollers=HEALTH_POLLERS,
        applied=sum(applied.values()),
        readyz_answers=pollers.answers,
    )


class Pollers:
    """``count`` threads asking ``/readyz`` of ``url`` one after another until stopped."""

    def __init__(self, url: str, count: int) -> None:
        self._url = url
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]
        self.answers = 0

    def start(self) -> Pollers:
        for t in self._threads:
            t.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                rel_support.http_json(self._url + "/readyz", timeout=120)
                self.answers += 1
            except OSError:  # serve stopped listening
                self._stop.wait(0.2)
            self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=130)
