"""A rebuild without downtime end to end: a real broker, a real ``serve`` process, real HTTP on loopback.

While turns are produced, readers hammer ``/v1/projects/read`` (first pages, pinned series begun before the
switch and paged after it, long-polls) and an admin starts a rebuild (``POST /v1/admin/rebuild``): every
answer is 200 ``ok`` (none pending, none ``resync_required``, none failed because of the switch), the
switch happens, and after a stop the rebuilt file sits at ``--db`` (the old one gone) with the very tables
a fresh replay of the log gives. ``serve --rebuild`` does the same at start.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_serve import READ_PATH, Serve, produce, turn

from throughline.producers.producer import TurnProducer
from throughline.projector.rebuild_files import RebuildFiles, turn_keys_of
from throughline.projector.runner import Projector
from throughline.projector.store import DuckProjection

pytestmark = pytest.mark.integration

TOKEN = "rebuild-admin-token-0123456789abcdef"
PROJECTS = [f"/srv/agents/rebuild-{i}" for i in range(4)]
REBUILD_PATH = "/v1/admin/rebuild"
SWITCH_TIMEOUT = 120.0
READERS = 4
MAX_READS = 200_000
SERIES_PAGES = 20


def _topic(name: str) -> str:
    return f"t-{name}-{os.getpid()}-{int(time.time() * 1000) % 10**8}"


def _replayed_digests(bootstrap: str, topic: str, path: Path) -> dict[str, str]:
    with DuckProjection.open(path, topic=topic) as fresh:
        assert Projector(fresh, bootstrap, topic).run(until_caught_up=True).caught_up
        return fresh.table_digests()


def _wait_phase(serve: Serve, phase: str, token: str | None) -> dict[str, Any]:
    deadline = time.monotonic() + SWITCH_TIMEOUT
    while True:
        status, _, body = serve.request("GET", REBUILD_PATH, token=token)
        assert status == 200, body
        document: dict[str, Any] = json.loads(body)
        if document["phase"] == phase:
            return document
        assert document["phase"] != "failed", document
        assert time.monotonic() < deadline, f"no {phase} within {SWITCH_TIMEOUT}s: {document}\n{serve.stderr()}"
        time.sleep(0.05)


class Hammer:
    """Readers that read until told to stop and keep every answer's (HTTP status, read status)."""

    def __init__(self, serve: Serve) -> None:
        self.serve = serve
        self.stop = threading.Event()
        self.answers: list[tuple[str, int, str]] = []
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def _keep(self, kind: str, status: int, body: bytes) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(body)
        with self.lock:
            self.answers.append((kind, status, str(document.get("status", document.get("error")))))
        return document

    def _read(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        status, _, payload = self.serve.request("POST", READ_PATH, body=body, token=TOKEN)
        return self._keep(kind, status, payload)

    def _reader(self, n: int) -> None:
        project = PROJECTS[n % len(PROJECTS)]
        # A cursor of the old file: every series below starts after it, across the switch.
        start = self._read("first", {"project": project, "limit": 1})["throughCursor"]
        for _ in range(MAX_READS):
            if self.stop.is_set():
                return
            page = self._read("first", {"project": project, "afterCursor": start, "limit": 7})
            head = page.get("throughCursor")
            for _ in range(SERIES_PAGES):  # pinned to ``head``, whenever the switch lands between its pages
                if page.get("status") != "ok" or page["page"]["complete"] or self.stop.is_set():
                    break
                time.sleep(0.01)
                page = self._read(
                    "pinned",
                    {
                        "project": project,
                        "afterCursor": start,
                        "throughCursor": head,
                        "pageToken": page["page"]["nextToken"],
                        "limit": 7,
                    },
                )
            if head and n == 0:  # one long-poll reader: waits carry over the switch
                self._read("long-poll", {"project": project, "afterCursor": head, "wait": 1})

    def start(self) -> None:
        for n in range(READERS):
            thread = threading.Thread(target=self._reader, args=(n,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def finish(self) -> list[tuple[str, int, str]]:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
            assert not thread.is_alive()
        return self.answers


def _producing(bootstrap: str, topic: str, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        with TurnProducer(bootstrap, topic, partitions=3) as producer:
            for n in range(100_000):
                if stop.wait(0.01):
                    return
                producer.append(**turn(10_000 + n, project=PROJECTS[n % len(PROJECTS)], thread="live"))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_every_read_through_a_rebuild_switch_is_ok(kafka_bootstrap: str, tmp_path: Path) -> None:
    topic = _topic("rebuild")
    db = tmp_path / "projection.duckdb"
    produce(kafka_bootstrap, topic, [turn(n, project=PROJECTS[n % len(PROJECTS)]) for n in range(1, 4001)])
    serve = Serve(kafka_bootstrap, topic, db, "--log-level", "info", env={"THROUGHLINE_AUTH_TOKEN": TOKEN}).start()
    stop_producing = threading.Event()
    producer: threading.Thread | None = None
    try:
        serve.wait_caught_up(minimum_records=4000)
        assert serve.request("POST", REBUILD_PATH)[0] == 401  # the admin token, as every other endpoint
        assert json.loads(serve.request("GET", REBUILD_PATH, token=TOKEN)[2])["phase"] == "idle"
        producer = _producing(kafka_bootstrap, topic, stop_producing)
        hammer = Hammer(serve)
        hammer.start()
        time.sleep(1.0)  # series pinned before the rebuild starts
        status, _, body = serve.request("POST", REBUILD_PATH, token=TOKEN)
        assert status == 202 and json.loads(body)["phase"] == "replaying", body
        again, _, refused = serve.request("POST", REBUILD_PATH, token=TOKEN)
        assert again == 409 and json.loads(refused)["error"]["code"] == "rebuild_refused"
        switched = _wait_phase(serve, "switched", TOKEN)
        time.sleep(1.5)  # and read on after it
        answers = hammer.finish()
        stop_producing.set()
        producer.join(60)
        bad = [a for a in answers if a[1:] != (200, "ok")]
        kinds = {a[0] for a in answers}
        assert not bad, f"{len(bad)} of {len(answers)} answers not ok: {bad[:10]}"
        assert {"first", "pinned", "long-poll"} <= kinds and len(answers) > 100
        assert switched["pausedSeconds"] is not None and switched["behind"] == 0
        assert "reads switched to" in serve.stderr()
        files = RebuildFiles(db)
        assert files.switched() and files.rebuilt.exists() and not db.exists()  # the old file went at the switch
        # The replay's turn keys were handed over and adopted (serve logs why when it scans instead).
        assert not turn_keys_of(files.rebuilt).exists() and "turn keys handed over" not in serve.stderr()
        metrics = serve.metrics(token=TOKEN)
        assert 'throughline_rebuild_phase{phase="switched"} 1' in metrics
        assert serve.request("POST", REBUILD_PATH, token=TOKEN)[0] == 409  # one switch per run
        serve.wait_caught_up()
    finally:
        stop_producing.set()
        code = serve.terminate()
    assert code == 0, serve.stderr()
    # The stop moved the rebuilt file to --db; it equals a fresh replay of the whole log.
    assert db.exists() and not files.rebuilt.exists() and not files.switched()
    with DuckProjection.open(db, read_only=True, topic=topic) as served:
        served_digests = served.table_digests()
    assert served_digests == _replayed_digests(kafka_bootstrap, topic, tmp_path / "fresh.duckdb")


def test_serve_rebuild_at_start_switches_and_keeps_serving(kafka_bootstrap: str, tmp_path: Path) -> None:
    topic = _topic("rebuild-flag")
    db = tmp_path / "projection.duckdb"
    produce(kafka_bootstrap, topic, [turn(n, project=PROJECTS[n % 2]) for n in range(1, 501)])
    first = Serve(kafka_bootstrap, topic, db).start()
    try:
        first.wait_caught_up(minimum_records=500)
    finally:
        assert first.terminate() == 0, first.stderr()
    serve = Serve(kafka_bootstrap, topic, db, "--rebuild").start()
    try:
        _wait_phase(serve, "switched", None)
        produce(kafka_bootstrap, topic, [turn(n, project=PROJECTS[0]) for n in range(501, 511)])
        serve.wait_caught_up(minimum_records=510)  # the live projector goes on, on the rebuilt file
        status, document = serve.get(READ_PATH, project=PROJECTS[0], limit=5)
        assert status == 200 and document["status"] == "ok" and document["turns"][-1]["seq"] == 260
    finally:
        code = serve.terminate()
    assert code == 0, serve.stderr()
    assert db.exists() and not RebuildFiles(db).rebuilt.exists() and not RebuildFiles(db).switched()
    with DuckProjection.open(db, read_only=True, topic=topic) as served:
        served_digests = served.table_digests()
    assert served_digests == _replayed_digests(kafka_bootstrap, topic, tmp_path / "fresh.duckdb")
