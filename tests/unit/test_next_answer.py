"""``NextAnswer``: overlapping calls share a request, and every answer was asked after its call began."""

from __future__ import annotations

import threading
import time

import pytest

from throughline.log.next_answer import NextAnswer

ASK_S = 0.02
JOIN_S = 30.0


class _Broker:
    """An ``ask`` that takes a while and records when each request started."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: list[float] = []
        self.inside = 0
        self.most_inside = 0
        self.fail_next = False

    def ask(self) -> float:
        with self.lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            fail, self.fail_next = self.fail_next, False
            start = time.monotonic()
            self.started.append(start)
        time.sleep(ASK_S)
        with self.lock:
            self.inside -= 1
        if fail:
            raise RuntimeError("the broker failed")
        return start  # the answer is when its request began


def _callers(shared: NextAnswer[float], threads: int, calls: int) -> list[tuple[float, float]]:
    """(call began, answer's request began) of every call."""
    got: list[tuple[float, float]] = []
    lock = threading.Lock()

    def caller() -> None:
        for _ in range(calls):
            began = time.monotonic()
            answer = shared.get()
            with lock:
                got.append((began, answer))

    workers = [threading.Thread(target=caller) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(JOIN_S)
    assert not any(w.is_alive() for w in workers), "a caller never got its answer"
    return got


def test_every_answer_was_asked_after_its_call_began() -> None:
    broker = _Broker()
    got = _callers(NextAnswer(broker.ask), threads=8, calls=10)
    assert len(got) == 80
    assert all(asked >= began for began, asked in got), [g for g in got if g[1] < g[0]][:3]


def test_overlapping_calls_share_requests_and_one_runs_at_a_time() -> None:
    broker = _Broker()
    _callers(NextAnswer(broker.ask), threads=8, calls=10)
    assert broker.most_inside == 1
    assert len(broker.started) < 80 * 0.6, f"{len(broker.started)} requests for 80 overlapping calls"


def test_a_lone_caller_asks_every_time() -> None:
    broker = _Broker()
    shared = NextAnswer(broker.ask)
    answers = [shared.get() for _ in range(3)]
    assert len(broker.started) == 3 and answers == broker.started


def test_a_failed_request_fails_its_asker_and_the_waiters_ask_again() -> None:
    broker = _Broker()
    shared = NextAnswer(broker.ask)
    broker.fail_next = True
    outcomes: list[str] = []
    lock = threading.Lock()

    def caller() -> None:
        try:
            shared.get()
            result = "ok"
        except RuntimeError:
            result = "failed"
        with lock:
            outcomes.append(result)

    first = threading.Thread(target=caller)
    first.start()
    time.sleep(ASK_S / 4)  # the failing request is in flight
    others = [threading.Thread(target=caller) for _ in range(3)]
    for t in others:
        t.start()
    for t in (first, *others):
        t.join(JOIN_S)
    assert sorted(outcomes) == ["failed", "ok", "ok", "ok"]


def test_an_answer_is_what_ask_returned() -> None:
    shared = NextAnswer(lambda: {0: 5, 1: 7})
    assert shared.get() == {0: 5, 1: 7}
    with pytest.raises(ZeroDivisionError):
        NextAnswer(lambda: 1 // 0).get()
