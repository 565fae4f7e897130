"""``PendingSend.acknowledged``: ``send_many``'s read of a position without waiting (kafka-python's
futures, no broker). A send not yet answered or failed gives ``None``, so ``send_many`` falls back to
``result`` and its typed errors."""

from __future__ import annotations

from kafka.errors import KafkaTimeoutError
from kafka.producer.future import FutureProduceResult, FutureRecordMetadata
from kafka.structs import TopicPartition

from throughline.producers.producer import LogPosition, PendingSend, TurnProducer


def _sends(count: int) -> tuple[FutureProduceResult, list[PendingSend]]:
    owner = TurnProducer.__new__(TurnProducer)  # no broker: acknowledged() reads only the future
    batch = FutureProduceResult(TopicPartition("t", 2))
    return batch, [PendingSend(owner, FutureRecordMetadata(batch, i, -1, None, 1, 10, -1), f"t{i}") for i in range(count)]


def test_an_acknowledged_send_gives_its_position_without_waiting() -> None:
    batch, sends = _sends(3)
    assert [s.acknowledged() for s in sends] == [None, None, None]  # not answered yet
    batch.success((40, -1, None))  # the broker put the batch at offset 40
    assert [s.acknowledged() for s in sends] == [LogPosition(2, 40), LogPosition(2, 41), LogPosition(2, 42)]


def test_a_failed_send_gives_none() -> None:
    batch, sends = _sends(1)
    batch.failure(KafkaTimeoutError("no answer"))
    assert sends[0].done
    assert sends[0].acknowledged() is None
