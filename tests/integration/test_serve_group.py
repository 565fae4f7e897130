"""``throughline serve --group`` end to end: real ``serve`` processes on loopback, one topic of 6 partitions.

One test, in phases, so that the members start once (they are the cost): three members answer every
project identically; a delta series paginated across the members is exact; one member SIGKILLed while
turns are produced: within the session timeout plus catch-up the other two serve every project, new
turns included; a fourth member joins and takes partitions; and every member's file, SIGKILLed one
included, holds exactly the log's fold of every partition it applied anything of (nothing lost, nothing
twice). docs/scale-out.md describes what is tested here.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from projector_env import exactly_once_invariants
from support.topic import Stored, read_topic_and_ends
from test_serve import KEY_HEX, Serve

from throughline.core.fold import ChainBook
from throughline.core.identity import project_sha256
from throughline.core.partitioning import partition_for
from throughline.producers.producer import TurnProducer
from throughline.projector.store import DuckProjection

PARTITIONS = 6
TOKEN = "group-integration-token-0123456789"
SESSION_TIMEOUT_MS = 6000  # the broker's default minimum: how soon a SIGKILLed member's partitions move
DEADLINE = 120.0
READ_PATH = "/v1/projects/read"


def _projects() -> list[str]:
    """Two projects on every partition (found by hashing, so each partition has work)."""
    found: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    for i in range(10_000):
        name = f"/srv/group/project-{i}"
        bucket = found[partition_for(project_sha256(name), PARTITIONS)]
        if len(bucket) < 2:
            bucket.append(name)
        if all(len(b) == 2 for b in found.values()):
            return [name for p in range(PARTITIONS) for name in found[p]]
    raise AssertionError("no two projects per partition found")


PROJECTS = _projects()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Member(Serve):
    """One ``serve --group`` process; its advertised URL is fixed before it starts."""

    def __init__(self, bootstrap: str, topic: str, db: Path, group: str) -> None:
        super().__init__(
            bootstrap,
            topic,
            db,
            env={
                "THROUGHLINE_AUTH_TOKEN": TOKEN,
                "THROUGHLINE_GROUP": group,
                "THROUGHLINE_GROUP_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
            },
        )
        self.db = db
        port = _free_port()
        self.advertised = f"http://127.0.0.1:{port}"
        self.args = [*self.args[:-2], "--port", str(port), "--advertise", self.advertised]

    def readyz(self) -> dict[str, Any]:
        return dict(self.get("/readyz")[1])

    def read(self, project: str, **params: Any) -> tuple[int, dict[str, Any]]:
        query = urllib.parse.urlencode({"project": project, **{k: v for k, v in params.items() if v is not None}})
        status, _, payload = self.request("GET", f"{READ_PATH}?{query}", token=TOKEN, timeout=30.0)
        return status, json.loads(payload)


def _wait(what: str, condition: Callable[[], bool], timeout: float = DEADLINE) -> float:
    started = time.monotonic()
    while True:
        if condition():
            return time.monotonic() - started
        assert time.monotonic() - started < timeout, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.2)


def _settled(members: list[Member]) -> bool:
    """Every member is in one generation of exactly ``members``, live on everything it holds."""
    reports = []
    for m in members:
        try:
            reports.append(m.readyz())
        except (OSError, ValueError):
            return False
    groups = [r.get("group") or {} for r in reports]
    if not all(g.get("joined") and g.get("members") for g in groups):
        return False
    urls = {m.advertised for m in members}
    return (
        len({g["generation"] for g in groups}) == 1
        and all({x["url"] for x in g["members"]} == urls for g in groups)
        and all(g["catchingUp"] == [] and g["heldLag"] == 0 for g in groups)
    )


class Ingest:
    """Appends turns to every project; remembers how many each project has."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = TurnProducer(bootstrap, topic, partitions=PARTITIONS)
        self.counts = {p: 0 for p in PROJECTS}

    def round(self) -> None:
        for project in PROJECTS:
            n = self.counts[project] + 1
            self.producer.append(
                project=project,
                host="host-a",
                thread="main",
                turn_id=f"{project}-{n}",
                completed_at=1_780_000_000_000_000 + n * 1000,
                body=f"turn {n} of {project}",
            )
            self.counts[project] = n
        self.producer.flush()


def _head_seq(member: Member, project: str) -> int | None:
    """The seq of the project's head as ``member`` answers a first contact (``None``: not ``ok``)."""
    try:
        status, doc = member.read(project, limit=1)
    except (OSError, ValueError):
        return None
    if status != 200 or doc["status"] != "ok":
        return None
    return int(doc["turns"][-1]["seq"]) if doc["turns"] else 0


def _serves_everything(members: list[Member], counts: dict[str, int]) -> bool:
    return all(_head_seq(m, p) == counts[p] for m in members for p in PROJECTS)


def _assert_file_is_the_fold(db: Path, records: list[Stored]) -> dict[int, int]:
    """Per partition the file applied anything of: its turns are exactly the fold of that prefix of the log."""
    exactly_once_invariants(db)
    with DuckProjection.open(db, read_only=True) as projection:
        applied = projection.applied_offsets()
        turns = projection.table_rows("turns")  # ordered by source, seq
    for p, upto in applied.items():
        book = ChainBook()
        for r in records:
            if r.partition == p and r.offset < upto:
                book.apply(r.turn, p, r.offset, r.key)
        expected = sorted(
            (s, t.seq, t.turn_id, t.content_digest, t.chain_digest, t.offset)
            for s, turns_of in book.live.items()
            for t in turns_of
        )
        rows = [
            (t["source_sha256"], t["seq"], t["turn_id"], t["content_digest"], t["chain_digest"], t["log_offset"])
            for t in turns
            if t["log_partition"] == p
        ]
        assert rows == expected, f"{db.name}: partition {p} (applied to {upto}) is not the log's fold"
    return applied


@pytest.fixture
def started() -> Iterator[list[Member]]:
    members: list[Member] = []
    yield members
    for m in members:
        m.kill()


def test_a_group_of_serve_members_answers_every_read_and_survives_a_sigkill(
    kafka_bootstrap: str,
    kafka_topic_name: str,
    kafka_group_id: str,
    tmp_path: Path,
    started: list[Member],
) -> None:
    t0 = time.monotonic()
    topic = kafka_topic_name  # the producer creates it as the producers do (6 partitions, every record kept)
    ingest = Ingest(kafka_bootstrap, topic)
    try:
        for _ in range(3):
            ingest.round()
        members = [Member(kafka_bootstrap, topic, tmp_path / f"m{i}.duckdb", kafka_group_id) for i in range(3)]
        started.extend(members)
        for m in members:
            m.start()
        took = _wait("three members in one generation, each live on what it holds", lambda: _settled(members))
        print(f"\nthree members settled in {took:.1f} s")
        report = members[0].readyz()["group"]
        assert report["copies"] == 2 and sorted(len(x["partitions"]) for x in report["members"]) == [4, 4, 4]

        # Every member answers every project, the same document whichever answers (own file or forwarded).
        for project in PROJECTS:
            answers = [m.read(project, limit=100) for m in members]
            assert all(a == answers[0] for a in answers), project
            assert answers[0][0] == 200 and [t["seq"] for t in answers[0][1]["turns"]] == [1, 2, 3]

        # A delta series paginated across the members is exact: page k from member k mod 3.
        project = PROJECTS[0]
        after = members[0].read(project, limit=100)[1]["throughCursor"]
        for _ in range(3):
            ingest.round()
        _wait("every member serving the new turns", lambda: _serves_everything(members, ingest.counts))
        seqs: list[int] = []
        through = token = None
        for page in range(10):
            status, doc = members[page % 3].read(project, after=after, through=through, pageToken=token, limit=1)
            assert status == 200 and doc["status"] == "ok", doc
            seqs += [t["seq"] for t in doc["turns"]]
            through, token = doc["throughCursor"], doc["page"]["nextToken"]
            if doc["page"]["complete"]:
                break
        assert seqs == [4, 5, 6]

        # SIGKILL one member while turns are being produced.
        stop = threading.Event()

        def produce() -> None:
            for _ in range(10):
                if stop.is_set():
                    return
                ingest.round()
                time.sleep(0.3)

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        time.sleep(1.0)
        victim = members.pop(1)
        victim.proc.kill()
        killed_at = time.monotonic()
        producer.join(timeout=60)
        assert not producer.is_alive()
        took = _wait("the two survivors serving every project", lambda: _serves_everything(members, ingest.counts))
        print(
            f"SIGKILL -> every project served again (new turns included) after {time.monotonic() - killed_at:.1f} s "
            f"(session timeout {SESSION_TIMEOUT_MS / 1000:g} s; {took:.1f} s after the last turn)"
        )
        _wait("two members in one generation", lambda: _settled(members))

        # A fourth member joins and takes partitions from the two.
        fourth = Member(kafka_bootstrap, topic, tmp_path / "m3.duckdb", kafka_group_id)
        started.append(fourth)
        members.append(fourth.start())
        took = _wait("the fourth member live in the group", lambda: _settled(members))
        print(f"a fourth member joined and caught up in {took:.1f} s")
        held = fourth.readyz()["group"]["held"]
        assert len(held) == 4, held  # 6 partitions x 2 copies over 3 members
        ingest.round()
        _wait("all three serving the last round", lambda: _serves_everything(members, ingest.counts))
        for project in PROJECTS:
            answers = [m.read(project, limit=100) for m in members]
            assert all(a == answers[0] for a in answers), project
    finally:
        ingest.producer.close()

    final_held = {m.db: list(m.readyz()["group"]["held"]) for m in members}
    for m in members:
        assert m.terminate() == 0, m.stderr()
    records, ends = read_topic_and_ends(kafka_bootstrap, topic)
    holders: dict[int, int] = {p: 0 for p in range(PARTITIONS)}
    for m in [*members, victim]:
        applied = _assert_file_is_the_fold(m.db, records)
        for p in final_held.get(m.db, []):
            assert applied[p] == ends[p], (m.db.name, p)  # a live holder applied its partitions to the end
        for p in applied:
            holders[p] += 1
    assert all(n >= 2 for n in holders.values()), holders  # every partition was projected by two at least
    print(f"group test took {time.monotonic() - t0:.1f} s")


def test_a_group_member_needs_the_shared_token_key_and_an_advertised_url(kafka_bootstrap: str, tmp_path: Path) -> None:
    from projector_env import cli_process

    env = {k: v for k, v in os.environ.items() if not k.startswith("THROUGHLINE_")}
    env["THROUGHLINE_BOOTSTRAP_SERVERS"] = kafka_bootstrap
    db = str(tmp_path / "x.duckdb")
    no_key = cli_process(
        "serve", "--db", db, "--topic", "t-unused", "--group", "g", "--advertise", "http://127.0.0.1:1", env=env
    )
    assert (
        no_key.returncode == 2
        and json.loads(no_key.stderr.strip().splitlines()[-1])["error"]["code"] == "token_key_unavailable"
    )
    env["THROUGHLINE_TOKEN_KEY"] = KEY_HEX
    no_url = cli_process("serve", "--db", db, "--topic", "t-unused", "--group", "g", env=env)
    assert no_url.returncode == 2
    assert json.loads(no_url.stderr.strip().splitlines()[-1])["error"]["code"] == "invalid_group_option"
