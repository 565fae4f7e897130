"""``serve --group`` figures (members sharing a topic, docs/scale-out.md): ``.venv/bin/python -m bench.group [--turns N] [--seconds S]``.

Not part of ``python -m bench`` (it writes no report; docs/scale-out.md quotes its output). Against a
real broker (``THROUGHLINE_TEST_BOOTSTRAP_SERVERS``, else one started here), one topic of 6 partitions
filled with ``--turns`` turns of 60 projects:

1. read throughput with **1** member, then with **3** members (K = 2): 8 client threads read first pages
   (``limit=10``) of random projects for ``--seconds``, spread round-robin over the members' URLs;
2. **SIGKILL -> served again**: one of the three is SIGKILLed; the time until both survivors answer
   every project ``ok`` at its head, and until the group has rebalanced without it (every partition
   two live holders again: session timeout ``--session-timeout-ms`` plus the rebalance).

On this 2-core machine the broker, three members and the clients share two cores: the 3-member
figure is a correctness figure (every read answered, a third forwarded), **not** a scaling claim.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from bench.common import PYTHON, broker, log
from bench.freshness_rig import stop_serve
from throughline.testing.kafka.support import free_port

PARTITIONS = 6
PROJECTS = [f"/bench/group/project-{i}" for i in range(60)]
KEY_HEX = "7a" * 32


class Member:
    """One ``serve --group`` subprocess."""

    def __init__(self, bootstrap: str, topic: str, group: str, db: Path, session_timeout_ms: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "THROUGHLINE_BOOTSTRAP_SERVERS": bootstrap,
            "THROUGHLINE_TOPIC": topic,
            "THROUGHLINE_DB": str(db),
            "THROUGHLINE_TOKEN_KEY": KEY_HEX,
            "THROUGHLINE_GROUP_SESSION_TIMEOUT_MS": str(session_timeout_ms),
        }
        env.pop("THROUGHLINE_AUTH_TOKEN", None)
        self.proc = subprocess.Popen(
            [
                PYTHON,
                "-m",
                "throughline.cli",
                "serve",
                "--port",
                str(self.port),
                "--group",
                group,
                "--advertise",
                self.url,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("http://"):
            raise SystemExit(f"a member did not start (exit {self.proc.poll()})")

    def get(self, path: str, timeout: float = 30.0) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, json.loads(exc.read() or b"null")

    def stop(self) -> None:
        stop_serve(self.proc, grace=60.0)


def _read(url: str, project: str) -> tuple[int, Any]:
    query = urllib.parse.urlencode({"project": project, "limit": 10})
    try:
        with urllib.request.urlopen(f"{url}/v1/projects/read?{query}", timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, None
    except OSError:
        return 0, None


def _settled(members: list[Member]) -> bool:
    groups = []
    for m in members:
        try:
            groups.append(m.get("/readyz", timeout=10)[1].get("group") or {})
        except OSError:
            return False
    urls = {m.url for m in members}
    return (
        all(g.get("joined") and g.get("members") for g in groups)
        and len({g["generation"] for g in groups}) == 1
        and all({x["url"] for x in g["members"]} == urls for g in groups)
        and all(g["catchingUp"] == [] and g["heldLag"] == 0 for g in groups)
    )


def _wait(what: str, condition: Any, timeout: float = 300.0) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - started


def _throughput(urls: list[str], seconds: float, threads: int = 8) -> tuple[float, int, int]:
    """Reads per second over ``urls`` (round-robin), and how many were ok / not ok."""
    stop = time.monotonic() + seconds
    counts = [0, 0]
    lock = threading.Lock()

    def client(i: int) -> None:
        rng = random.Random(i)
        n = i
        while time.monotonic() < stop:
            status, doc = _read(urls[n % len(urls)], rng.choice(PROJECTS))
            n += 1
            with lock:
                counts[0 if status == 200 and doc and doc["status"] == "ok" else 1] += 1

    workers = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(threads)]
    started = time.monotonic()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    took = time.monotonic() - started
    return (counts[0] + counts[1]) / took, counts[0], counts[1]


def _fill(bootstrap: str, topic: str, turns: int) -> dict[str, int]:
    from throughline.producers.producer import TurnProducer

    heads = dict.fromkeys(PROJECTS, 0)
    with TurnProducer(bootstrap, topic, partitions=PARTITIONS) as producer:
        for start in range(0, turns, 1000):  # pipelined: one append waits for its acknowledgement
            batch = []
            for n in range(start, min(turns, start + 1000)):
                project = PROJECTS[n % len(PROJECTS)]
                heads[project] += 1
                batch.append(
                    producer.build(
                        project=project,
                        host="h",
                        thread="t",
                        turn_id=f"{project}-{heads[project]}",
                        completed_at=1_780_000_000_000_000 + n,
                        body=f"turn {n} " + "x" * 200,
                    )
                )
            producer.send_many(batch)
    return heads


def _serves_heads(urls: list[str], heads: dict[str, int]) -> bool:
    for url in urls:
        for project in PROJECTS:
            status, doc = _read(url, project)
            if status != 200 or not doc or doc["status"] != "ok" or doc["turns"][-1]["seq"] != heads[project]:
                return False
    return True


def main(argv: list[str] | None = None) -> int:
    """Run the measurements and print them side by side."""
    p = argparse.ArgumentParser(
        prog="python -m bench.group", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--turns", type=int, default=20_000)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--session-timeout-ms", type=int, default=10_000)
    a = p.parse_args(argv)
    members: list[Member] = []
    with broker() as bootstrap, tempfile.TemporaryDirectory(prefix="bench-group-") as tmp:
        topic, group = f"bench.group-{os.getpid()}", f"bench-group-{os.getpid()}"
        try:
            log(f"filling {topic} with {a.turns} turns of {len(PROJECTS)} projects")
            heads = _fill(bootstrap, topic, a.turns)
            members.append(Member(bootstrap, topic, group, Path(tmp) / "m0.duckdb", a.session_timeout_ms))
            _wait("one member caught up", lambda: _settled(members))
            one = _throughput([members[0].url], a.seconds)
            log(f"1 member: {one[0]:.0f} reads/s ({one[1]} ok, {one[2]} not ok)")
            for i in (1, 2):
                members.append(Member(bootstrap, topic, group, Path(tmp) / f"m{i}.duckdb", a.session_timeout_ms))
            joined = _wait("three members caught up", lambda: _settled(members))
            three = _throughput([m.url for m in members], a.seconds)
            log(f"3 members: {three[0]:.0f} reads/s ({three[1]} ok, {three[2]} not ok)")
            victim = members.pop(1)
            victim.proc.kill()
            killed = time.monotonic()
            victim.proc.wait(timeout=30)
            passes = [0]

            def one_pass() -> bool:
                passes[0] += 1
                return _serves_heads([m.url for m in members], heads)

            served = _wait("every project served by the survivors", one_pass)
            _wait("the group rebalanced without it", lambda: _settled(members))
            rebalanced = time.monotonic() - killed
            figures = [
                ("read throughput, 1 member", f"{one[0]:.0f} reads/s", f"{one[2]} not ok"),
                (
                    "read throughput, 3 members (K=2)",
                    f"{three[0]:.0f} reads/s",
                    f"{three[2]} not ok; ratio {three[0] / one[0]:.2f}x",
                ),
                ("2 members join, caught up and live", f"{joined:.1f} s", f"{a.turns} turns in the log"),
                (
                    "SIGKILL -> every project served by the survivors",
                    f"{served:.2f} s",
                    f"{passes[0]} sequential pass(es) over {2 * len(PROJECTS)} reads; K=2: the other holder answers",
                ),
                (
                    "SIGKILL -> group rebalanced without it",
                    f"{rebalanced:.1f} s",
                    f"session timeout {a.session_timeout_ms / 1000:g} s, then every partition 2 live holders",
                ),
            ]
        finally:
            for m in members:
                m.stop()
    width = max(len(f[0]) for f in figures)
    print(f"\nserve --group on {os.cpu_count()} cores (broker, members and clients share them):")
    for name, value, note in figures:
        print(f"  {name.ljust(width)}  {value:>12}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
