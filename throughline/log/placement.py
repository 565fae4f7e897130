"""``TopicClient``: what a client of the topic of turns knows of it, and where a project's records go.

``TurnProducer`` and ``KafkaLog`` each open on one topic and read its partition count once (a topic's
partition count must never change, ``throughline.log.topic``); both place a project with the core's
``partition_for`` over that count, so the producer writes a project where the reader looks for it.
"""

from __future__ import annotations

from throughline.core.partitioning import partition_for


class TopicClient:
    """The topic a client was opened on: its name, partition count and servers (set by the subclass)."""

    _topic: str
    _partitions: int
    _servers: list[str]

    @property
    def topic(self) -> str:
        """The topic's name."""
        return self._topic

    @property
    def partitions(self) -> int:
        """The topic's partition count (read once, when the client opened)."""
        return self._partitions

    @property
    def bootstrap_servers(self) -> list[str]:
        """The servers this client talks to."""
        return list(self._servers)

    def partition_of(self, project_sha256: bytes) -> int:
        """The partition that holds the project's records (Kafka's murmur2 partitioner over its hash)."""
        return partition_for(project_sha256, self._partitions)
