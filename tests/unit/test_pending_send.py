"""``PendingSend.acknowledged`` (``send_many``'s read of a position without waiting) and ``when_done``
(a callback per send instead of a thread waiting on it), on kafka-python's futures without a broker. A
send not yet answered or failed gives ``None``, so ``send_many`` falls back to ``result`` and its typed
errors; ``when_done`` hands a failure over as the same typed error."""

from __future__ import annotations

import pytest
from kafka.errors import KafkaTimeoutError
from kafka.producer.future import FutureProduceResult, FutureRecordMetadata
from kafka.structs import TopicPartition

from throughline.log import BrokerUnavailableError, KafkaErrors
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


def test_when_done_reports_each_acknowledgement_once_the_batch_is_answered() -> None:
    batch, sends = _sends(2)
    got: list[LogPosition] = []
    failures: list[Exception] = []
    sends[0].when_done(got.append, failures.append)
    assert got == []  # nothing until the broker answers
    batch.success((7, -1, None))
    sends[1].when_done(got.append, failures.append)  # already answered: called at once
    assert got == [LogPosition(2, 7), LogPosition(2, 8)]
    assert failures == []


def test_when_done_reports_a_failure_as_the_typed_error_result_raises() -> None:
    batch, sends = _sends(1)
    sends[0]._owner.kafka_errors = KafkaErrors(["127.0.0.1:9"])
    sends[0]._owner._servers = ["127.0.0.1:9"]
    sends[0]._owner.send_timeout = 1.0
    got: list[LogPosition] = []
    failures: list[Exception] = []
    sends[0].when_done(got.append, failures.append)
    batch.failure(KafkaTimeoutError("no answer"))
    assert got == []
    assert [type(e) for e in failures] == [BrokerUnavailableError]
    assert failures[0].retriable
    with pytest.raises(BrokerUnavailableError) as raised:
        sends[0].result(timeout=0.1)
    assert str(raised.value) == str(failures[0])
