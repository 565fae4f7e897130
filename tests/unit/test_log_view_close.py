"""Closing ``KafkaLog`` while a request is in flight and callers queue behind it (no broker needed).

During a broker failover each of the view's requests waits out its timeout. ``serve`` closes its view
when it stops; before, ``close`` and every queued caller waited their turn for the consumer, one
timeout each, and the process outlived its shutdown by minutes. Now ``close`` returns at once, queued
callers raise ``log_closed`` at once, and the request in flight closes the consumer when it returns.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from throughline.log.exceptions import LogError
from throughline.log.next_answer import NextAnswer
from throughline.log.translate import KafkaErrors
from throughline.log.view import KafkaLog


class SlowConsumer:
    """Stands in for kafka-python's consumer: ``end_offsets`` blocks until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.closed = threading.Event()
        self.calls = 0

    def end_offsets(self, tps: list[Any], timeout_ms: int) -> dict[Any, int]:
        self.calls += 1
        self.entered.set()
        assert self.release.wait(10)
        return dict.fromkeys(tps, 7)

    def close(self) -> None:
        assert not self.closed.is_set(), "closed twice"
        self.closed.set()


def _view(consumer: SlowConsumer) -> KafkaLog:
    view = KafkaLog.__new__(KafkaLog)  # the consumer is the only part under test
    view._servers = ["127.0.0.1:9"]
    view._topic = "t"
    view._timeout_ms = 10_000
    view._lock = threading.Lock()
    view._closed = False
    view._consumer_closed = False
    view._errors = KafkaErrors(view._servers, None)
    view._consumer = consumer
    view._partitions = 1
    view._ends = NextAnswer(lambda: view._ask([0], first=False))
    return view


def test_close_does_not_wait_for_the_request_in_flight_nor_the_queue() -> None:
    consumer = SlowConsumer()
    view = _view(consumer)
    results: list[Any] = []

    def call() -> None:
        try:
            results.append(view._ask([0], first=False))
        except LogError as exc:
            results.append(exc.code)

    first = threading.Thread(target=call)
    first.start()
    assert consumer.entered.wait(5)
    queued = [threading.Thread(target=call) for _ in range(5)]
    for t in queued:
        t.start()
    time.sleep(0.3)  # they are waiting for the consumer
    started = time.monotonic()
    view.close()
    assert time.monotonic() - started < 0.5
    for t in queued:
        t.join(timeout=2)
        assert not t.is_alive(), "a queued caller still waits after close"
    assert results == ["log_closed"] * 5
    assert not consumer.closed.is_set()  # still in use by the request in flight
    consumer.release.set()
    first.join(timeout=5)
    assert results[-1] == {0: 7}  # the request in flight got its answer
    assert consumer.closed.is_set() and consumer.calls == 1  # and closed the consumer on its way out
    with pytest.raises(LogError) as later:
        view.end_offsets()
    assert later.value.code == "log_closed"


def test_close_of_an_idle_view_closes_the_consumer_now() -> None:
    consumer = SlowConsumer()
    view = _view(consumer)
    view.close()
    view.close()
    assert consumer.closed.is_set()
