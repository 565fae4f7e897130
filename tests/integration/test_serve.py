"""``throughline serve`` end to end: a real broker, a real ``serve`` process, real HTTP on loopback.

Every wire status and every hard error code goes over the wire; a long-poll is answered with the turn
produced while it waited; authentication refuses a missing or wrong token; SIGTERM while turns are being
produced loses nothing (after a restart the projection equals a replay of the log); the metrics parse.
"""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from projector_env import WORKER_FAULT, worker_fault_env

from throughline.core.cursor import decode_cursor
from throughline.core.identity import project_sha256
from throughline.core.page_token import SeriesBinding, issue_page_token
from throughline.producers.producer import TurnProducer
from throughline.projector.runner import Projector
from throughline.projector.store import DuckProjection
from throughline.reader import Observer, load_observer_state
from throughline.serve.client import HttpReader

KEY_HEX = "5f" * 32
TOKEN = "integration-token-0123456789abcdef"
PROJECT = "/srv/agents/serve-test"
OTHER = "/srv/agents/other-project"
START_TIMEOUT = 90.0
STOP_TIMEOUT = 60.0
HTTP_TIMEOUT = 60.0
READ_PATH = "/v1/projects/read"


class Serve:
    """A ``throughline serve`` subprocess on a free loopback port."""

    scheme = "http://"  # how the URL serve prints starts
    context: ssl.SSLContext | None = None  # how requests verify the server (HTTPS only)

    def __init__(self, bootstrap: str, topic: str, db: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.env = {
            **os.environ,
            "THROUGHLINE_BOOTSTRAP_SERVERS": bootstrap,
            "THROUGHLINE_TOPIC": topic,
            "THROUGHLINE_DB": str(db),
            "THROUGHLINE_TOKEN_KEY": KEY_HEX,
            **(env or {}),
        }
        if "THROUGHLINE_AUTH_TOKEN" not in (env or {}):
            self.env.pop("THROUGHLINE_AUTH_TOKEN", None)  # authentication stays off unless a test asks
        self.args = [sys.executable, "-m", "throughline.cli", "serve", "--port", "0", *extra]
        self.stderr_path = db.with_suffix(".serve.log")
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.signalled = False

    def start(self) -> Serve:
        with open(self.stderr_path, "a", encoding="utf-8") as err:
            self.proc = subprocess.Popen(self.args, env=self.env, stdout=subprocess.PIPE, stderr=err, text=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(START_TIMEOUT)
        if not lines or not lines[0].startswith(self.scheme):
            self.kill()
            raise AssertionError(f"serve did not print its {self.scheme} URL; stderr:\n{self.stderr()}")
        self.url = lines[0].strip()
        return self

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")[-4000:]

    def signal_stop(self) -> None:
        """One SIGTERM (a second one would ask for an immediate stop)."""
        assert self.proc is not None
        if not self.signalled:
            self.signalled = True
            self.proc.send_signal(signal.SIGTERM)

    def terminate(self) -> int:
        """SIGTERM, then wait (bounded) for the exit code."""
        assert self.proc is not None
        self.signal_stop()
        try:
            return self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"serve did not stop on SIGTERM; stderr:\n{self.stderr()}") from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    # -- HTTP

    def request(
        self, method: str, path: str, *, body: Any = None, token: str | None = None, timeout: float = HTTP_TIMEOUT
    ) -> tuple[int, dict[str, str], bytes]:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self.context) as response:
                return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()

    def get(self, path: str, **params: Any) -> tuple[int, Any]:
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        status, _, payload = self.request("GET", path + query)
        return status, json.loads(payload) if payload.startswith((b"{", b"[")) else payload.decode()

    def post(self, body: Any, token: str | None = None) -> tuple[int, Any]:
        status, _, payload = self.request("POST", READ_PATH, body=body, token=token)
        return status, json.loads(payload)

    def metrics(self, token: str | None = None) -> str:
        status, headers, payload = self.request("GET", "/metrics", token=token)
        assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
        return payload.decode()

    def wait_caught_up(self, minimum_records: int = 0) -> dict[str, Any]:
        """Poll /readyz (bounded) until every partition's lag is 0 and at least ``minimum_records`` applied."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            status, report = self.get("/readyz")
            applied = sum(p["appliedOffset"] for p in report["partitions"])
            if status == 200 and report["lag"] == 0 and applied >= minimum_records:
                return dict(report)
            assert time.monotonic() < deadline, f"serve did not catch up: {report}"
            time.sleep(0.1)


def produce(bootstrap: str, topic: str, turns: list[dict[str, Any]]) -> None:
    with TurnProducer(bootstrap, topic, partitions=3) as producer:
        for turn in turns:
            producer.append(**turn)


def turn(
    n: int, *, project: str = PROJECT, host: str = "host-a", thread: str = "main", seq: int | None = None
) -> dict[str, Any]:
    return {
        "project": project,
        "host": host,
        "thread": thread,
        "turn_id": f"{project}-{host}-{thread}-{n}",
        "completed_at": 1_780_000_000_000_000 + n * 1000,
        "body": f"turn {n} of {thread} ✓",
        "seq": seq,
    }


def parse_metrics(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Samples by (name, labels); asserts every line is well-formed text format."""
    sample = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (-?[0-9.eE+-]+|\+Inf|-Inf|NaN)$")
    label = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            assert not line or line.startswith(("# HELP ", "# TYPE ")), line
            continue
        m = sample.match(line)
        assert m, f"malformed sample: {line!r}"
        out[(m.group(1), frozenset(label.findall(m.group(3) or "")))] = float(m.group(4).replace("Inf", "inf"))
    return out


def error_of(status: int, document: Any) -> str:
    assert set(document) == {"error"}, document
    return str(document["error"]["code"])


# ------------------------------------------------------------------------------------------ one shared serve


@pytest.fixture(scope="module")
def world(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A topic with turns of two projects, and a serve that has projected them."""
    topic = f"t-serve-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    db = tmp_path_factory.mktemp("serve") / "projection.duckdb"
    produce(kafka_bootstrap, topic, [turn(n, seq=n) for n in range(1, 6)] + [turn(1, project=OTHER)])
    serve = Serve(kafka_bootstrap, topic, db).start()
    try:
        serve.wait_caught_up(minimum_records=6)
        yield {"serve": serve, "topic": topic, "bootstrap": kafka_bootstrap, "db": db}
    finally:
        code = serve.terminate()
        assert code == 0, serve.stderr()


def test_ok_is_the_wire_document(world: dict[str, Any]) -> None:
    serve: Serve = world["serve"]
    status, document = serve.get(READ_PATH, project=PROJECT, limit=3)
    assert status == 200
    assert document["schema"] == "throughline.observer_read.v1" and document["status"] == "ok"
    assert [t["seq"] for t in document["turns"]] == [3, 4, 5]
    assert document["historyTruncated"] is True and document["page"] == {"complete": True, "nextToken": None}
    assert set(document) == {
        "schema",
        "status",
        "thread",
        "afterCursor",
        "throughCursor",
        "turns",
        "historyTruncated",
        "page",
    }
    assert "host-a" not in json.dumps(document) and "turn_id" not in json.dumps(document)
    post_status, posted = serve.post({"project": PROJECT, "limit": 3})
    assert post_status == 200 and posted == document


def test_a_delta_series_pages_over_http(world: dict[str, Any]) -> None:
    serve: Serve = world["serve"]
    reader = HttpReader(serve.url)
    first = reader.read_observer_turn_page(project=PROJECT, limit=1)
    cursor = decode_cursor(first.throughCursor)
    produce(world["bootstrap"], world["topic"], [turn(n) for n in range(300, 304)])
    page = reader.read_observer_turn_page(project=PROJECT, after_cursor=first.throughCursor, limit=3)
    served = [t.seq for t in page.turns]
    for _ in range(10):
        if page.page.complete:
            break
        page = reader.read_observer_turn_page(
            project=PROJECT,
            after_cursor=first.throughCursor,
            through_cursor=page.throughCursor,
            page_token=page.page.nextToken,
            limit=3,
        )
        served += [t.seq for t in page.turns]
    assert served == list(range(cursor.length + 1, cursor.length + 5))  # type: ignore[union-attr]


def test_resync_required_after_a_rollback(world: dict[str, Any]) -> None:
    serve: Serve = world["serve"]
    project = "/srv/agents/rollback"
    produce(world["bootstrap"], world["topic"], [turn(n, project=project, seq=n) for n in range(1, 4)])
    serve.wait_caught_up()
    _, first = serve.get(READ_PATH, project=project)
    produce(world["bootstrap"], world["topic"], [turn(99, project=project, seq=2)])  # rewinds to seq 2
    serve.wait_caught_up()
    status, document = serve.get(READ_PATH, project=project, afterCursor=first["throughCursor"])
    assert status == 200 and document["status"] == "resync_required"
    assert document["turns"] == [] and document["page"] == {"complete": False, "nextToken": None}


def test_every_hard_error_is_400_with_its_code(world: dict[str, Any]) -> None:
    serve: Serve = world["serve"]
    _, first = serve.get(READ_PATH, project=PROJECT, limit=2)
    after = first["throughCursor"]
    produce(world["bootstrap"], world["topic"], [turn(200)])
    serve.wait_caught_up()
    _, page = serve.get(READ_PATH, project=PROJECT, afterCursor=after, limit=1)
    through = page["throughCursor"]
    key = bytes.fromhex(KEY_HEX)
    binding = SeriesBinding.of(project_sha256(PROJECT), after, through)
    past_the_end = issue_page_token(key, binding, 10_000)
    other_series = issue_page_token(key, SeriesBinding.of(project_sha256(PROJECT), None, through), 1)
    good = issue_page_token(key, binding, 0)
    head, _, mac = good.rpartition(".")
    tampered = f"{head}.{'B' if mac[0] == 'A' else 'A'}{mac[1:]}"
    series = {"project": PROJECT, "afterCursor": after, "throughCursor": through}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"project": PROJECT, "limit": 0}, "invalid_limit"),
        ({"project": PROJECT, "limit": 101}, "invalid_limit"),
        ({"project": PROJECT, "limit": "10"}, "invalid_limit"),
        ({"project": ""}, "invalid_project"),
        ({"project": PROJECT, "afterCursor": "tlc1.not-a-cursor!"}, "invalid_cursor"),
        ({"project": PROJECT, "throughCursor": 5}, "invalid_cursor"),
        ({"project": PROJECT, "pageToken": good}, "page_token_unbound"),
        ({**series, "pageToken": "tlp1." + "A" * 4200 + ".AAAA"}, "page_token_oversize"),
        ({**series, "pageToken": "tlp7." + good[5:]}, "page_token_version"),
        ({**series, "pageToken": "not a token"}, "page_token_malformed"),
        ({**series, "pageToken": tampered}, "page_token_tampered"),
        ({**series, "pageToken": other_series}, "page_token_mismatch"),
        ({**series, "pageToken": past_the_end}, "page_token_offset"),
        ({"project": PROJECT, "wait": -1}, "invalid_wait"),
        ({"project": PROJECT, "afterCursorr": after}, "invalid_arguments"),
    ]
    for body, code in cases:
        status, document = serve.post(body)
        assert status == 400, (code, document)
        assert error_of(status, document) == code
    status, document = serve.get(READ_PATH, project=PROJECT, limit="many")
    assert status == 400 and error_of(status, document) == "invalid_limit"


def test_oversized_requests_are_refused(world: dict[str, Any]) -> None:
    serve: Serve = world["serve"]
    status, _, payload = serve.request("POST", READ_PATH, body={"project": "p" * 70_000})
    assert status == 413 and json.loads(payload)["error"]["code"] == "request_too_large"
    status, _, payload = serve.request("GET", f"{READ_PATH}?project={'p' * 20_000}")
    assert status == 414 and json.loads(payload)["error"]["code"] == "request_too_large"


def test_a_quarantined_source_is_409(world: dict[str, Any]) -> None:
    serve: Serve = world["serve"]
    project = "/srv/agents/broken"
    produce(world["bootstrap"], world["topic"], [turn(1, project=project, seq=1), turn(2, project=project, seq=5)])
    serve.wait_caught_up()
    status, document = serve.get(READ_PATH, project=project)
    assert status == 409 and error_of(status, document) == "source_quarantined"


def test_a_long_poll_returns_with_the_turn_produced_while_it_waited(world: dict[str, Any]) -> None:
    serve: Serve = world["serve"]
    project = "/srv/agents/long-poll"
    produce(world["bootstrap"], world["topic"], [turn(1, project=project)])
    serve.wait_caught_up()
    _, first = serve.get(READ_PATH, project=project)
    results: list[Any] = []

    def poll() -> None:
        results.append(serve.post({"project": project, "afterCursor": first["throughCursor"], "wait": 30}))

    thread = threading.Thread(target=poll)
    thread.start()
    deadline = time.monotonic() + 30
    while parse_metrics(serve.metrics())[("throughline_long_polls_waiting", frozenset())] < 1:
        assert time.monotonic() < deadline, "the long-poll never started waiting"
        time.sleep(0.05)
    produce(world["bootstrap"], world["topic"], [turn(2, project=project)])
    thread.join(timeout=45)
    assert not thread.is_alive()
    status, document = results[0]
    # An answer holding the new turn can only come from the wake-up: at the cap it would be empty.
    assert status == 200 and document["status"] == "ok"
    assert [t["seq"] for t in document["turns"]] == [2]
    assert document["afterCursor"] == first["throughCursor"]


def test_the_observer_audits_over_http(world: dict[str, Any], tmp_path: Path) -> None:
    serve: Serve = world["serve"]
    audited: list[int] = []
    state = tmp_path / "observer.json"
    observer = Observer(HttpReader(serve.url), project=OTHER, state_path=state, audit=lambda t: audited.append(t.seq))
    summary = observer.run_series()
    assert summary.saved and audited == [1]
    assert load_observer_state(state) == summary.through_cursor


def test_health_readiness_and_metrics(world: dict[str, Any]) -> None:
    serve: Serve = world["serve"]
    status, health = serve.get("/healthz")
    assert status == 200 and health == {"status": "alive", "projector": "running"}
    report = serve.wait_caught_up()
    assert report["projector"] == "running" and len(report["partitions"]) == 3
    # Reads answer from what the projector folded (``appliedOffset``); the file holds it within a commit
    # interval (``committedOffset``: the writer commits staged polls at most every 100 ms).
    assert all(0 <= p["committedOffset"] <= p["appliedOffset"] for p in report["partitions"])
    deadline = time.monotonic() + 30
    while any(p["committedOffset"] < p["endOffset"] for p in serve.get("/readyz")[1]["partitions"]):
        assert time.monotonic() < deadline, "the staged records were never committed"
        time.sleep(0.05)
    status, _ = serve.get(READ_PATH, project=PROJECT)  # one read of its own: the test runs alone too
    assert status == 200
    samples = parse_metrics(serve.metrics())
    for p in report["partitions"]:
        labels = frozenset({("partition", str(p["partition"]))})
        assert (
            samples[("throughline_projector_applied_offset", labels)] == samples[("throughline_log_end_offset", labels)]
        )
        assert samples[("throughline_projector_lag_records", labels)] == 0
    assert samples[("throughline_projector_turns_applied_total", frozenset())] >= 6
    assert samples[("throughline_projector_quarantined_records_total", frozenset())] >= 0
    assert samples[("throughline_reads_total", frozenset({("status", "ok")}))] >= 1
    assert samples[("throughline_read_duration_seconds_count", frozenset())] >= 1
    assert ("throughline_read_duration_seconds_bucket", frozenset({("le", "+Inf")})) in samples
    # Every record committed was in one counted transaction, each with a wall time.
    none = frozenset()
    assert (
        samples[("throughline_projector_transaction_records_sum", none)]
        == samples[("throughline_projector_records_total", none)]
    )
    assert samples[("throughline_projector_transaction_duration_seconds_count", none)] >= 1
    assert samples[("throughline_projector_transaction_duration_seconds_sum", none)] > 0
    _, openapi = serve.get("/openapi.json")
    assert READ_PATH in openapi["paths"]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the ``throughline`` console script (bounded)."""
    return subprocess.run(
        [sys.executable, "-m", "throughline.cli", *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_read_and_observe_talk_to_serve_with_url(world: dict[str, Any], tmp_path: Path) -> None:
    serve: Serve = world["serve"]
    assert "--url" in cli("read", "--help").stdout, (
        "throughline/commands/read.py lacks --url (see throughline.commands.options)"
    )
    outside = {"THROUGHLINE_DB": str(tmp_path / "absent.duckdb"), "THROUGHLINE_BOOTSTRAP_SERVERS": "127.0.0.1:9"}
    read = cli("read", "--url", serve.url, "--project", OTHER, env=outside)
    assert read.returncode == 0, read.stderr
    _, document = serve.get(READ_PATH, project=OTHER)
    assert json.loads(read.stdout) == document  # the same document, without the projection file or broker
    bad = cli("read", "--url", serve.url, "--project", OTHER, "--after", "garbage", env=outside)
    assert bad.returncode == 2 and json.loads(bad.stderr.splitlines()[-1])["error"]["code"] == "invalid_cursor"
    state = tmp_path / "observer.json"
    observed = cli("observe", "--url", serve.url, "--project", OTHER, "--state", str(state), env=outside)
    assert observed.returncode == 0, observed.stderr
    assert load_observer_state(state) == document["throughCursor"]
    away = cli("read", "--url", "http://127.0.0.1:9", "--project", OTHER, env=outside)
    assert away.returncode == 1
    assert json.loads(away.stderr.splitlines()[-1])["error"]["code"] == "server_unavailable"


def test_a_following_observer_stops_during_its_long_poll(world: dict[str, Any], tmp_path: Path) -> None:
    """SIGTERM ends ``observe --follow --url`` at once, not when the server answers the long-poll
    (which it holds for up to 25 s while no turn arrives); the saved cursor is the last series'."""
    serve: Serve = world["serve"]
    state = tmp_path / "observer.json"
    outside = {"THROUGHLINE_DB": str(tmp_path / "absent.duckdb"), "THROUGHLINE_BOOTSTRAP_SERVERS": "127.0.0.1:9"}
    argv = ["observe", "--url", serve.url, "--project", OTHER, "--state", str(state), "--follow"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "throughline.cli", *argv, "--interval", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **outside},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert state.exists() and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        saved = state.read_bytes()
        time.sleep(2.0)  # the next series' first page is now held by the server: no turn arrives
        asked = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - asked
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert took < 10.0, f"observe waited {took:.1f}s for its long-poll to end"
    assert b"stopped after 1 series" in err, err
    assert state.read_bytes() == saved


# ------------------------------------------------------------------------------------------ own serves


def test_projection_pending_while_nobody_projects(kafka_bootstrap: str, tmp_path: Path) -> None:
    topic = f"t-pending-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    db = tmp_path / "projection.duckdb"
    produce(kafka_bootstrap, topic, [turn(1)])
    serve = Serve(kafka_bootstrap, topic, db).start()
    serve.wait_caught_up(minimum_records=1)
    assert serve.terminate() == 0
    produce(kafka_bootstrap, topic, [turn(2)])  # on the log, projected by nobody
    frozen = Serve(kafka_bootstrap, topic, db, "--no-projector", "--read-wait", "0.2").start()
    try:
        status, document = frozen.get(READ_PATH, project=PROJECT)
        assert status == 200 and document["status"] == "projection_pending"
        assert document["turns"] == [] and document["throughCursor"] is None
        readiness, report = frozen.get("/readyz")
        assert report["projector"] == "off" and report["lag"] == 1
        samples = parse_metrics(frozen.metrics())
        assert samples[("throughline_reads_total", frozenset({("status", "projection_pending")}))] == 1
    finally:
        assert frozen.terminate() == 0


def test_authentication_refuses_a_missing_or_wrong_token(kafka_bootstrap: str, tmp_path: Path) -> None:
    topic = f"t-auth-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    produce(kafka_bootstrap, topic, [turn(1)])
    serve = Serve(kafka_bootstrap, topic, tmp_path / "p.duckdb", env={"THROUGHLINE_AUTH_TOKEN": TOKEN}).start()
    try:
        for token in (None, "wrong-token-wrong-token-wrong"):
            status, headers, payload = serve.request("GET", f"{READ_PATH}?project=x", token=token)
            assert status == 401 and json.loads(payload)["error"]["code"] == "unauthorized"
            assert headers["www-authenticate"].startswith("Bearer")
            assert serve.request("GET", "/metrics", token=token)[0] == 401
        assert serve.post({"project": PROJECT}, token=TOKEN)[0] == 200
        assert serve.request("GET", "/healthz")[0] == 200
        # The CLI's --url client sends the token from THROUGHLINE_AUTH_TOKEN (or --auth-token-file).
        refused = cli(
            "read", "--url", serve.url, "--project", PROJECT, env={"THROUGHLINE_AUTH_TOKEN": "wrong-token-wrong-token"}
        )
        assert refused.returncode == 1
        assert json.loads(refused.stderr.splitlines()[-1])["error"]["code"] == "unauthorized"
        accepted = cli("read", "--url", serve.url, "--project", PROJECT, env={"THROUGHLINE_AUTH_TOKEN": TOKEN})
        assert accepted.returncode == 0 and json.loads(accepted.stdout)["status"] == "ok"
    finally:
        assert serve.terminate() == 0


def test_a_non_loopback_bind_without_a_token_is_refused(kafka_bootstrap: str, tmp_path: Path) -> None:
    env = {**os.environ, "THROUGHLINE_BOOTSTRAP_SERVERS": kafka_bootstrap, "THROUGHLINE_DB": str(tmp_path / "p.duckdb")}
    env.pop("THROUGHLINE_AUTH_TOKEN", None)
    done = subprocess.run(
        [sys.executable, "-m", "throughline.cli", "serve", "--host", "0.0.0.0", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert json.loads(done.stderr.strip().splitlines()[-1])["error"]["code"] == "auth_token_required"
    assert done.stdout == ""


def test_a_fetch_worker_that_raises_is_restarted_and_serve_keeps_projecting(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    # The worker's own code raises (not a kill, not a Kafka error): serve's projector must take it as the
    # retriable fetch_worker_failed, start the worker again from the applied offsets and go on.
    topic = f"t-worker-fault-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    env, marker = worker_fault_env(tmp_path)
    produce(kafka_bootstrap, topic, [turn(n, seq=n) for n in range(1, 6)])
    serve = Serve(kafka_bootstrap, topic, tmp_path / "projection.duckdb", env=env).start()
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert serve.proc is not None and serve.proc.poll() is None, f"serve stopped:\n{serve.stderr()}"
            status, document = serve.get(READ_PATH, project=PROJECT, limit=10)
            if status == 200 and document["status"] == "ok" and len(document["turns"]) == 5:
                break
            assert time.monotonic() < deadline, f"the turns never became readable: {document}\n{serve.stderr()}"
            time.sleep(0.1)
        assert not marker.exists(), "the worker never raised"
        produce(kafka_bootstrap, topic, [turn(6, seq=6)])  # the restarted worker keeps fetching
        serve.wait_caught_up(minimum_records=6)
        assert serve.proc.poll() is None, serve.stderr()
    finally:
        code = serve.terminate()
    log = serve.stderr_path.read_text(encoding="utf-8", errors="replace")
    assert code == 0, log
    assert "restarting the fetch worker" in log and f"RuntimeError: {WORKER_FAULT}" in log, log
    assert "Traceback" not in log, log


def test_sigterm_while_producing_loses_nothing(kafka_bootstrap: str, tmp_path: Path) -> None:
    topic = f"t-sigterm-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    db = tmp_path / "projection.duckdb"
    projects = [f"/srv/agents/p{i}" for i in range(6)]
    total = 3000
    turns = [turn(n, project=projects[n % len(projects)], thread=f"t{n % 4}") for n in range(total)]
    produce(kafka_bootstrap, topic, turns[:1])
    serve = Serve(kafka_bootstrap, topic, db).start()
    producer_error: list[BaseException] = []
    halfway = threading.Event()
    stopping = threading.Event()

    def producing() -> None:
        try:
            with TurnProducer(kafka_bootstrap, topic) as producer:
                for start in range(1, total, 100):
                    if start > total // 3:
                        halfway.set()
                        # Keep sending (slowly) until serve is told to stop, whatever the two speeds.
                        stopping.wait(2.0)
                    producer.send_many(_built(producer, turns[start : start + 100]))
        except BaseException as exc:  # reported by the assertion below
            producer_error.append(exc)
        finally:
            halfway.set()

    thread = threading.Thread(target=producing)
    thread.start()
    assert halfway.wait(60)
    deadline = time.monotonic() + 60
    while parse_metrics(serve.metrics())[("throughline_projector_turns_applied_total", frozenset())] < 200:
        assert time.monotonic() < deadline, "the projector applied nothing"
        time.sleep(0.02)
    serve.signal_stop()
    stopped_while_producing = thread.is_alive()
    stopping.set()
    assert serve.terminate() == 0, serve.stderr()
    thread.join(timeout=120)
    assert not thread.is_alive() and not producer_error, producer_error
    assert stopped_while_producing  # two thirds of the turns were still being sent when serve stopped

    restarted = Serve(kafka_bootstrap, topic, db).start()
    try:
        report = restarted.wait_caught_up(minimum_records=total)
        assert sum(p["endOffset"] for p in report["partitions"]) == total
    finally:
        assert restarted.terminate() == 0

    # Batch replay of the whole log into a new file must give the very same tables.
    replayed = tmp_path / "replayed.duckdb"
    with DuckProjection.open(replayed, topic=topic) as rebuilt:
        summary = Projector(rebuilt, kafka_bootstrap, topic).run(until_caught_up=True)
        assert summary.caught_up
    with DuckProjection.open(db, read_only=True) as served, DuckProjection.open(replayed, read_only=True) as rebuilt:
        assert served.stats().turns == total  # every turn once: nothing lost, nothing doubled
        assert served.table_digests() == rebuilt.table_digests()


def _built(producer: TurnProducer, fields: list[dict[str, Any]]) -> list[Any]:
    return [producer.build(**f) for f in fields]
