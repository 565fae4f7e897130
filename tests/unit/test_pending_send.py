"""``PendingSend.acknowledged`` (``send_many``'s read of a position without waiting) and ``when_done``
(a callback per send instead of a thread waiting on it), on kafka-python's futures without a broker. A
send not yet answered or failed gives ``None``, so ``send_many`` falls back to ``result`` and its typed
errors; ``when_done`` hands a failure over as the same typed error; ``result`` answers within the send
timeout counted from the send even when the client never completes the future."""

from __future__ import annotations

import time

import pytest
from kafka.errors import KafkaTimeoutError
from kafka.producer.future import FutureProduceResult, FutureRecordMetadata
from kafka.structs import TopicPartition

from throughline.log import BrokerUnavailableError, KafkaErrors
from throughline.producers.producer import RESULT_GRACE_S, LogPosition, PendingSend, TurnProducer


def _sends(count: int) -> tuple[FutureProduceResult, list[PendingSend]]:
    owner = TurnProducer.__new__(TurnProducer)  # no broker: acknowledged() reads only the future
    batch = FutureProduceResult(TopicPartition("t", 2))
    return batch, [
        PendingSend(owner, FutureRecordMetadata(batch, i, -1, None, 1, 10, -1), f"t{i}", 0.0) for i in range(count)
    ]


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


def test_a_position_carries_the_log_append_time_the_broker_answered() -> None:
    batch, sends = _sends(2)
    batch.success((40, 1_767_225_600_123, None))  # a LogAppendTime topic: the broker's append instant
    got: list[LogPosition] = []
    sends[1].when_done(got.append, lambda _exc: None)
    assert [s.acknowledged() for s in sends] == [LogPosition(2, 40), LogPosition(2, 41)]
    sends[0]._owner.kafka_errors = KafkaErrors(["127.0.0.1:9"])
    assert [p.timestamp_ms for p in (sends[0].acknowledged(), got[0], sends[0].result(timeout=0.1))] == [
        1_767_225_600_123
    ] * 3


def test_a_position_carries_the_create_time_on_a_create_time_topic_and_none_when_unknown() -> None:
    owner = TurnProducer.__new__(TurnProducer)
    batch = FutureProduceResult(TopicPartition("t", 0))
    created = PendingSend(owner, FutureRecordMetadata(batch, 0, 1_767_225_600_000, None, 1, 10, -1), "a", 0.0)
    unknown = PendingSend(owner, FutureRecordMetadata(batch, 1, -1, None, 1, 10, -1), "b", 0.0)
    batch.success((5, -1, None))  # CreateTime: the broker answers -1
    assert created.acknowledged() == LogPosition(0, 5)
    assert created.acknowledged().timestamp_ms == 1_767_225_600_000  # type: ignore[union-attr]
    assert unknown.acknowledged().timestamp_ms is None  # type: ignore[union-attr]
    # The timestamp is not part of a position's identity.
    assert LogPosition(0, 5, 1) == LogPosition(0, 5, 2) == LogPosition(0, 5)
    assert hash(LogPosition(0, 5, 1)) == hash(LogPosition(0, 5))


def test_result_answers_once_the_send_timeout_has_passed_since_the_send_even_if_the_client_never_does() -> None:
    # kafka-python does not expire a batch while its idempotent producer waits for a producer id (no
    # controller quorum): the future stays open, and the send timeout must still bound the answer.
    owner = TurnProducer.__new__(TurnProducer)
    owner.kafka_errors = KafkaErrors(["127.0.0.1:9"])
    owner._servers = ["127.0.0.1:9"]
    owner.send_timeout = 2.0
    batch = FutureProduceResult(TopicPartition("t", 0))
    sent_at = time.monotonic() - 2.0 - RESULT_GRACE_S + 0.2  # handed over 0.2 s before its bound
    pending = PendingSend(owner, FutureRecordMetadata(batch, 0, -1, None, 1, 10, -1), "a", sent_at)
    began = time.monotonic()
    with pytest.raises(BrokerUnavailableError) as raised:
        pending.result()
    waited = time.monotonic() - began
    assert raised.value.retriable
    assert 0.1 <= waited < 1.5, waited  # the rest of the bound, not a fresh send timeout
    assert not pending.done  # the client may still deliver it later: a retry is applied once
