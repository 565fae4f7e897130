"""``PeriodicCheck``: the log check runs off the projector's thread, and its verdict reaches the loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from throughline.log import BrokerUnavailableError, LogError
from throughline.projector.periodic_check import PeriodicCheck

BOUND_S = 10.0


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_the_check_runs_on_its_own_thread_on_its_schedule() -> None:
    threads: list[str] = []
    with PeriodicCheck(lambda: threads.append(threading.current_thread().name), 0.01):
        _until(lambda: len(threads) >= 3, "the check did not run three times")
    seen = len(threads)
    time.sleep(0.05)
    assert len(threads) == seen, "the check ran after the block"
    assert set(threads) == {"throughline-log-check"}


def test_a_failure_is_raised_once_on_the_loops_thread_and_checking_goes_on() -> None:
    calls = [0]
    failure = BrokerUnavailableError(["127.0.0.1:1"], "the broker did not answer")

    def check() -> None:
        calls[0] += 1
        if calls[0] == 2:
            raise failure

    with PeriodicCheck(check, 0.01) as periodic:
        periodic.raise_pending()  # nothing yet, or nothing to say
        _until(lambda: calls[0] >= 2, "the check did not run twice")
        with pytest.raises(LogError) as raised:
            periodic.raise_pending()
        assert raised.value is failure
        periodic.raise_pending()  # raised once only
        _until(lambda: calls[0] >= 4, "the check stopped after a failure")
        periodic.raise_pending()  # the later checks passed


def test_the_first_failure_waits_for_the_loop_and_is_not_replaced() -> None:
    calls = [0]

    def check() -> None:
        calls[0] += 1
        raise RuntimeError(f"failure {calls[0]}")

    with PeriodicCheck(check, 0.01) as periodic:
        _until(lambda: calls[0] >= 3, "the check did not run three times")
        with pytest.raises(RuntimeError, match="failure 1$"):
            periodic.raise_pending()
