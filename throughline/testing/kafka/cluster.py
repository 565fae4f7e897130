"""A three-node KRaft cluster of JVM brokers on loopback, for tests that kill leaders and controllers.

Every node is a combined broker+controller (:class:`~throughline.testing.kafka.jvm.KafkaBroker` with
its own ``node.id``); ``controller.quorum.voters`` names all three, the loopback ports are picked free
once, and one cluster id formats the storage of every node. A node can be crashed (``kill``: SIGKILL),
stopped (``stop``: SIGTERM, a controlled shutdown) and started again on the same data and ports
(``start``). ``leader_of`` says which node leads a partition (the brokers' metadata), ``active_controller``
which node leads the KRaft quorum (the nodes' ``quorum-state`` files), and ``wait_healthy`` waits until
every node is up and every partition's in-sync replicas are all its replicas again.

Internal topics (consumer offsets, transactions) have three replicas and at least two in sync; a
topic's own replication is whatever the test creates it with (``create_topic``).

Usage::

    with KafkaCluster() as cluster:
        cluster.create_topic("t", partitions=3, replication_factor=3, configs={"min.insync.replicas": "2"})
        cluster.kill(cluster.leader_of("t", 0))
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from throughline.testing.kafka.admin import admin_client, create_topic
from throughline.testing.kafka.config import LOOPBACK, Reporter, startup_timeout_s, stderr_reporter
from throughline.testing.kafka.exceptions import BrokerStartError, HarnessError
from throughline.testing.kafka.handle import closed_on_failure
from throughline.testing.kafka.jvm import BrokerSettings, KafkaBroker
from throughline.testing.kafka.maven import KafkaDistribution, fetch_kafka_jars
from throughline.testing.kafka.support import free_ports, random_cluster_id

NODES = 3
_T = TypeVar("_T")

#: What a cluster node changes in the single node's server.properties (later keys win).
_CLUSTER_PROPERTIES = (
    ("offsets.topic.replication.factor", "3"),
    ("transaction.state.log.replication.factor", "3"),
    ("transaction.state.log.min.isr", "2"),
    ("share.coordinator.state.topic.replication.factor", "3"),
    ("share.coordinator.state.topic.min.isr", "2"),
    ("default.replication.factor", "3"),
    # A follower that stops fetching (a stalled JVM) leaves the ISR after 5 s instead of 30 s; a
    # crashed one leaves it when the controller fences it (broker.session.timeout.ms, 3 s).
    ("replica.lag.time.max.ms", "5000"),
    ("unclean.leader.election.enable", "false"),
)


def _cluster_settings(node_id: int, port: int, controller_port: int, voters: str) -> BrokerSettings:
    return BrokerSettings(
        host=LOOPBACK,
        port=port,
        controller_port=controller_port,
        # Three JVMs beside the session broker on a small machine: small heaps (a test broker holds
        # a few MB of data), and the C1 compiler only (less CPU at start, plenty fast for tests).
        heap_min="128m",
        heap_max="384m",
        extra_properties=(
            ("node.id", str(node_id)),
            ("controller.quorum.voters", voters),
            *_CLUSTER_PROPERTIES,
        ),
        extra_jvm_args=("-XX:TieredStopAtLevel=1",),
    )


class KafkaCluster:
    """Three JVM Kafka nodes (broker and controller each) forming one KRaft cluster on loopback.

    Nodes are numbered 1..3 (their ``node.id``, which is also the broker id the metadata names).
    """

    provider = "jvm-cluster"

    def __init__(self, *, report: Reporter | None = None, distribution: KafkaDistribution | None = None) -> None:
        """Configure the cluster (ports and cluster id picked now); nothing starts until :meth:`start`."""
        self._report = report or stderr_reporter
        self._distribution = distribution
        ports = free_ports(2 * NODES, LOOPBACK)
        self.cluster_id = random_cluster_id()
        voters = ",".join(f"{i + 1}@{LOOPBACK}:{ports[NODES + i]}" for i in range(NODES))
        self._nodes: dict[int, KafkaBroker] = {}
        for i in range(NODES):
            node_id = i + 1
            settings = _cluster_settings(node_id, ports[i], ports[NODES + i], voters)
            self._nodes[node_id] = KafkaBroker(settings=settings, report=self._report, cluster_id=self.cluster_id)
        self.voters = voters
        self.last_startup_s: float | None = None

    # -- what it is ---------------------------------------------------------------------------

    @property
    def node_ids(self) -> list[int]:
        """The node ids, ``[1, 2, 3]``."""
        return sorted(self._nodes)

    def node(self, node_id: int) -> KafkaBroker:
        """The JVM broker of node ``node_id``."""
        try:
            return self._nodes[node_id]
        except KeyError:
            raise HarnessError(f"no node {node_id!r} in the cluster (nodes {self.node_ids})") from None

    @property
    def bootstrap_servers(self) -> str:
        """Every node's ``host:port``, comma-separated (clients find the live ones)."""
        return ",".join(self._nodes[i].bootstrap_servers for i in self.node_ids)

    @property
    def supports_restart(self) -> bool:
        return True

    def running(self) -> list[int]:
        """The ids of the nodes whose JVM is alive."""
        return [i for i in self.node_ids if self._nodes[i].is_running()]

    def describe(self) -> str:
        """One line: the nodes, their addresses and pids."""
        nodes = ", ".join(f"node {i} at {n.host}:{n.settings.port} (pid {n.pid})" for i, n in self._nodes.items())
        return f"three-node KRaft cluster {self.cluster_id}: {nodes}"

    def diagnostics(self, lines: int = 30) -> str:
        """The tail of every node's logs, for error messages."""
        return "\n".join(f"=== node {i} ===\n{n.diagnostics(lines)}" for i, n in self._nodes.items())

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, *, timeout_s: float | None = None) -> KafkaCluster:
        """Start every node that is not running, together (a quorum needs two of three to answer), and
        wait until every node is up and every partition fully replicated."""
        timeout_s = startup_timeout_s() if timeout_s is None else timeout_s
        self._distribution = self._distribution or fetch_kafka_jars(report=self._report)
        for node in self._nodes.values():
            node._distribution = self._distribution
        started = time.monotonic()
        with closed_on_failure(self):
            # Launched from this thread (a JVM started from a short-lived thread would get no
            # parent-death signal), then waited for: none answers before two of them run.
            for node in self._nodes.values():
                node.start(timeout_s=timeout_s, wait=False)
            for node in self._nodes.values():
                node.wait_ready(timeout_s=timeout_s)
            self.wait_healthy(timeout_s=timeout_s)
        self.last_startup_s = time.monotonic() - started
        return self

    def kill(self, node_id: int) -> None:
        """Crash node ``node_id`` (SIGKILL); its data stays for :meth:`start_node`."""
        self.node(node_id).kill()

    def stop(self, node_id: int) -> None:
        """Stop node ``node_id`` gracefully (SIGTERM: a controlled shutdown); its data stays."""
        self.node(node_id).stop(keep_data=True)

    def start_node(self, node_id: int, *, timeout_s: float | None = None) -> None:
        """Start node ``node_id`` again on the same data, ports and cluster id; wait until it answers."""
        self.node(node_id).start(timeout_s=timeout_s)

    def restart(self, *, graceful: bool = True) -> None:
        """A rolling restart: each node in turn stopped, started, and the cluster healthy again."""
        for node_id in self.node_ids:
            self.node(node_id).stop(keep_data=True, graceful=graceful)
            self.start_node(node_id)
            self.wait_healthy()

    def close(self) -> None:
        """Stop every node and remove their work dirs (unless kept)."""
        for node in self._nodes.values():
            with contextlib.suppress(Exception):
                node.stop(keep_data=False, graceful=False)

    # -- who leads ----------------------------------------------------------------------------

    def admin(self, timeout_s: float = 10.0) -> Any:
        """A ``KafkaAdminClient`` on the nodes that are running (close it)."""
        live = [self._nodes[i].bootstrap_servers for i in self.running()]
        if not live:
            raise HarnessError("no node of the cluster is running")
        return admin_client(",".join(live), timeout_s)

    def _ask(self, question: Callable[[Any], _T], *, timeout_s: float = 30.0) -> _T:
        """``question(admin)`` on the running nodes, asked again (bounded) while it fails: right after a
        kill the clients' metadata still names the dead node, and a request sent to it is refused."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                admin = self.admin()
                try:
                    return question(admin)
                finally:
                    admin.close()
            except Exception:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def partitions(self, topic: str | None = None) -> list[dict[str, Any]]:
        """Every partition (of ``topic``, else of every topic) as the metadata says now: ``topic``,
        ``partition``, ``leader``, ``replicas``, ``isr``."""
        described = self._ask(lambda admin: admin.describe_topics([topic] if topic is not None else None))
        out = []
        for info in described:
            name = info.get("topic", info.get("name"))
            if info.get("error_code"):
                raise HarnessError(f"topic {name!r}: error {info.get('error_code')}")
            for p in info.get("partitions") or []:
                out.append(
                    {
                        "topic": name,
                        "partition": p.get("partition_index", p.get("partition")),
                        "leader": p.get("leader_id", p.get("leader", -1)),
                        "replicas": list(p.get("replica_nodes", p.get("replicas", []))),
                        "isr": list(p.get("isr_nodes", p.get("isr", []))),
                    }
                )
        return out

    def leader_of(self, topic: str, partition: int) -> int:
        """The node that leads ``topic``'s ``partition`` now (``-1``: none)."""
        for p in self.partitions(topic):
            if p["partition"] == partition:
                return int(p["leader"])
        raise HarnessError(f"topic {topic!r} has no partition {partition}")

    def active_controller(self) -> int:
        """The node that leads the KRaft quorum (the active controller): what DescribeQuorum answers, else
        the leader of the highest epoch the running nodes' ``quorum-state`` files know (``-1``: none yet)."""
        try:
            quorum = self._ask(lambda admin: admin.describe_metadata_quorum(), timeout_s=5.0)
            leader = int(quorum["topics"][0]["partitions"][0]["leader_id"])
            if leader >= 0:
                return leader
        except Exception:  # a node still electing, or no DescribeQuorum: the files say it too
            pass
        best = (-1, -1)
        for node_id in self.running():
            state = _quorum_state(self._nodes[node_id].data_dir)
            if state is not None and state[1] > best[1]:
                best = state
        return best[0]

    def wait_controller(self, *, other_than: int | None = None, timeout_s: float = 60.0) -> int:
        """Wait (bounded) until a running node other than ``other_than`` leads the quorum; its id."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self.active_controller()
            if leader in self.running() and leader != other_than:
                return leader
            time.sleep(0.2)
        raise HarnessError(f"no active controller other than {other_than} after {timeout_s:g}s")

    def wait_healthy(self, *, timeout_s: float = 120.0) -> float:
        """Wait (bounded) until every node runs and is registered, and every partition of every topic has
        a leader and all its replicas in sync; the seconds waited."""
        started = time.monotonic()
        deadline = started + timeout_s
        last = "not asked yet"
        while time.monotonic() < deadline:
            if len(self.running()) < NODES:
                last = f"running nodes {self.running()}"
            else:
                try:
                    last = self._unhealthy() or ""
                except Exception as exc:  # a node still starting: not healthy yet
                    last = f"{type(exc).__name__}: {exc}"
                if not last:
                    return time.monotonic() - started
            time.sleep(0.25)
        raise BrokerStartError(f"the cluster was not healthy after {timeout_s:g}s: {last}\n{self.diagnostics(10)}")

    def _unhealthy(self) -> str | None:
        brokers = self._ask(lambda admin: admin.describe_cluster().get("brokers") or [], timeout_s=0.0)
        if len(brokers) < NODES:
            return f"{len(brokers)} brokers registered"
        for p in self.partitions():
            if p["leader"] is None or p["leader"] < 0 or sorted(p["isr"]) != sorted(p["replicas"]):
                return f"{p['topic']}[{p['partition']}]: leader {p['leader']}, isr {p['isr']} of {p['replicas']}"
        return None

    def create_topic(
        self,
        name: str,
        *,
        partitions: int,
        replication_factor: int = NODES,
        configs: Mapping[str, str] | None = None,
    ) -> None:
        """Create topic ``name`` and wait (bounded) until every partition has a leader."""
        create_topic(
            self.bootstrap_servers,
            name,
            partitions=partitions,
            replication_factor=replication_factor,
            configs=configs,
        )


def _quorum_state(data_dir: Path) -> tuple[int, int] | None:
    """(leader id, epoch) from a node's ``quorum-state`` file (``None``: none yet, or being rewritten)."""
    try:
        doc = json.loads((data_dir / "__cluster_metadata-0" / "quorum-state").read_text(encoding="utf-8"))
        return int(doc.get("leaderId", -1)), int(doc.get("leaderEpoch", -1))
    except (OSError, ValueError, TypeError, AttributeError):
        return None
