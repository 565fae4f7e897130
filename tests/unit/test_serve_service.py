"""The pieces of ``throughline serve`` that need no broker: the projector thread, binding, auth, metrics."""

from __future__ import annotations

import math
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from throughline.errors import ThroughlineError
from throughline.log.exceptions import BrokerUnavailableError
from throughline.projector.exceptions import LogRewoundError
from throughline.serve.auth import BearerAuth, is_loopback, load_auth_token, require_token_off_loopback
from throughline.serve.exceptions import (
    AuthTokenRequiredError,
    InvalidAuthTokenError,
    ProjectorFailedError,
    UnauthorizedError,
)
from throughline.serve.metrics import Registry
from throughline.serve.service import ProjectorThread, bind_socket, url_of

TOKEN = "a-perfectly-fine-token-0123456789"


def _wait_for(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


# ------------------------------------------------------------------------------------------ projector thread


def test_a_stopped_projector_ends_cleanly() -> None:
    exits: list[bool] = []
    ran = threading.Event()

    def loop(stop: threading.Event) -> None:
        ran.set()
        stop.wait(10)

    thread = ProjectorThread(loop, on_exit=lambda: exits.append(True))
    thread.start()
    assert ran.wait(5)
    assert thread.phase() == "running"
    assert thread.join(5)
    assert thread.phase() == "stopped" and thread.error() is None and exits == [True]


def test_a_retriable_failure_is_retried_not_fatal() -> None:
    attempts: list[int] = []
    exits: list[bool] = []

    def loop(stop: threading.Event) -> None:
        attempts.append(1)
        if len(attempts) <= 2:
            raise BrokerUnavailableError(["127.0.0.1:1"], "refused")
        stop.wait(10)

    thread = ProjectorThread(loop, on_exit=lambda: exits.append(True), retry_first=0.01)
    thread.start()
    _wait_for(lambda: len(attempts) == 3)
    _wait_for(lambda: thread.phase() == "running")
    assert thread.error() is None and not exits
    assert thread.join(5) and thread.phase() == "stopped"


def test_retrying_is_visible_and_gives_up_after_its_window() -> None:
    exits: list[bool] = []

    def loop(stop: threading.Event) -> None:
        raise BrokerUnavailableError(["127.0.0.1:1"], "refused")

    thread = ProjectorThread(loop, on_exit=lambda: exits.append(True), retry_window=0.2, retry_first=0.02)
    thread.start()
    _wait_for(lambda: bool(exits))
    assert thread.phase() == "failed"
    failure = thread.error()
    assert isinstance(failure, BrokerUnavailableError) and failure.code == "broker_unavailable"


def test_a_stop_during_an_outage_is_a_clean_stop() -> None:
    # SIGTERM while the broker is away: the loop's request runs out of time after the stop was asked.
    # That is a stop, not a failure (serve exits 0), and the retry in progress is no error either.
    exits: list[bool] = []
    asking = threading.Event()

    def loop(stop: threading.Event) -> None:
        asking.set()
        stop.wait(10)
        raise BrokerUnavailableError(["127.0.0.1:1"], "timed out")

    thread = ProjectorThread(loop, on_exit=lambda: exits.append(True))
    thread.start()
    assert asking.wait(5)
    assert thread.join(5)
    assert thread.phase() == "stopped" and thread.error() is None and exits == [True]


def test_a_stop_while_waiting_to_retry_is_not_a_failure() -> None:
    failing = threading.Event()

    def loop(stop: threading.Event) -> None:
        failing.set()
        raise BrokerUnavailableError(["127.0.0.1:1"], "refused")

    thread = ProjectorThread(loop, on_exit=lambda: None, retry_first=30.0)
    thread.start()
    assert failing.wait(5)
    _wait_for(lambda: thread.error() is not None)  # retrying: visible on /readyz
    assert thread.join(5)
    assert thread.phase() == "stopped"  # run_service raises only a "failed" projector's error


def test_a_hard_failure_stops_the_service() -> None:
    exits: list[bool] = []

    def loop(stop: threading.Event) -> None:
        raise LogRewoundError("two histories")

    thread = ProjectorThread(loop, on_exit=lambda: exits.append(True))
    thread.start()
    _wait_for(lambda: bool(exits))
    assert thread.phase() == "failed" and thread.error() is not None and thread.error().code == "log_rewound"  # type: ignore[union-attr]


def test_a_crash_or_an_unasked_return_is_a_failure() -> None:
    for loop, code in (
        (lambda stop: 1 / 0, "projector_failed"),
        (lambda stop: None, "projector_failed"),
    ):
        exits: list[bool] = []
        thread = ProjectorThread(loop, on_exit=lambda exits=exits: exits.append(True))  # type: ignore[misc]
        thread.start()
        _wait_for(lambda exits=exits: bool(exits))  # type: ignore[misc]
        failure = thread.error()
        assert isinstance(failure, ProjectorFailedError) and failure.code == code


# ------------------------------------------------------------------------------------------ binding


def test_port_zero_binds_a_free_loopback_port() -> None:
    sock = bind_socket("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        assert port > 0 and url_of(sock, "127.0.0.1") == f"http://127.0.0.1:{port}"
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # the kernel queues the connection: it listens
    finally:
        sock.close()


def test_a_taken_port_is_a_clear_error() -> None:
    sock = bind_socket("127.0.0.1", 0)
    try:
        with pytest.raises(ThroughlineError) as caught:
            bind_socket("127.0.0.1", sock.getsockname()[1])
        assert caught.value.code == "bind_failed"
    finally:
        sock.close()


# ------------------------------------------------------------------------------------------ auth


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.4", False),
        ("example.internal", False),
    ],
)
def test_loopback_detection(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
    if loopback:
        require_token_off_loopback(host, None)
    else:
        with pytest.raises(AuthTokenRequiredError) as caught:
            require_token_off_loopback(host, None)
        assert caught.value.exit_code == 2
        require_token_off_loopback(host, TOKEN)


def test_tokens_come_from_a_file_or_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n", encoding="utf-8")
    assert load_auth_token(str(path), environ={}) == TOKEN
    assert load_auth_token(None, environ={"THROUGHLINE_AUTH_TOKEN": TOKEN}) == TOKEN
    assert load_auth_token(None, environ={}) is None
    assert load_auth_token(None, environ={"THROUGHLINE_AUTH_TOKEN": ""}) is None
    for bad in ("short", "has a space inside it", "caf\u00e9-token-0123456789"):
        with pytest.raises(InvalidAuthTokenError):
            load_auth_token(None, environ={"THROUGHLINE_AUTH_TOKEN": bad})
    with pytest.raises(InvalidAuthTokenError) as caught:
        load_auth_token(str(tmp_path / "missing"), environ={})
    assert TOKEN not in caught.value.message


def test_bearer_checks() -> None:
    auth = BearerAuth(TOKEN)
    auth.check(f"Bearer {TOKEN}")
    auth.check(f"bearer  {TOKEN}")
    for header in (None, "", TOKEN, f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer ", f"Bearer {TOKEN[:-1]}"):
        with pytest.raises(UnauthorizedError) as caught:
            auth.check(header)
        assert TOKEN not in caught.value.message
    BearerAuth(None).check(None)  # off: everything passes


# ------------------------------------------------------------------------------------------ metrics

_LINE = re.compile(
    r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"(,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")*\})? \S+$'
)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=20), st.lists(st.floats(min_value=0, max_value=100, allow_nan=False), max_size=20))
def test_exposition_lines_are_well_formed(label: str, observations: list[float]) -> None:
    registry = Registry()
    counter = registry.counter("x_total", "help with \\ and\nnewline", ["code"])
    gauge = registry.gauge("g", "a gauge", ["partition"])
    histogram = registry.histogram("h_seconds", "a histogram", [0.1, 1, 10])
    counter.inc(2, code=label)
    gauge.set(math.inf, partition=label)
    for value in observations:
        histogram.observe(value)
    text = registry.render()
    for line in text.rstrip("\n").split("\n"):  # the format splits on \n only (not splitlines()' set)
        assert line.startswith("# ") or _LINE.match(line), line
    buckets = [float(v) for v in re.findall(r'^h_seconds_bucket\{le="[^"]+"\} (\S+)$', text, re.M)]
    assert buckets == sorted(buckets) and buckets[-1] == len(observations)  # cumulative, +Inf = count
    assert f"h_seconds_count {len(observations)}" in text


def test_metric_rules() -> None:
    registry = Registry()
    with pytest.raises(ValueError):
        registry.counter("no_suffix", "counters end in _total")
    counter = registry.counter("c_total", "c")
    with pytest.raises(ValueError):
        counter.inc(-1)
    with pytest.raises(ValueError):
        registry.counter("c_total", "twice")
    gauge = registry.gauge("g", "g", ["partition"])
    with pytest.raises(ValueError):
        gauge.set(1, other="x")
    gauge.replace([({"partition": 0}, 5)])
    gauge.replace([({"partition": 1}, 7)])
    assert gauge.value(partition=0) is None and gauge.value(partition=1) == 7
