"""Re-ingesting a thread with a newer parser, end to end: the real console script, a real broker, the
real projector. The old parser's turns, then the new parser's (an extra interrupted turn in the middle,
a fuller reply under a turn id sent before, a turn the old parser made up dropped), numbered with
explicit seqs as ``ingest -`` takes them: nothing is quarantined, no source is broken, the live chain is
the new parser's, and an Observer whose cursor was past the changed point is told to resync, then reads
the new chain (docs/design.md, "Re-ingesting with a newer parser").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

CLI = str(Path(sys.executable).with_name("throughline"))
RUN_TIMEOUT_S = 120.0
PROJECT = "/work/upgrade"


def cli(bootstrap: str, topic: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "THROUGHLINE_BOOTSTRAP_SERVERS": bootstrap, "THROUGHLINE_TOPIC": topic}
    for name in ("THROUGHLINE_DB", "THROUGHLINE_TOKEN_KEY", "THROUGHLINE_TOKEN_KEY_FILE", "THROUGHLINE_URL"):
        env.pop(name, None)
    return subprocess.run(
        [CLI, *args], input=stdin, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )


def turns(*spec: tuple[str, str, int]) -> list[dict[str, Any]]:
    """Ingest lines of one thread: (turn id, body, second of completedAt), numbered 1.. in order."""
    return [
        {
            "project": PROJECT,
            "host": "laptop",
            "thread": "session-1",
            "turnId": turn_id,
            "completedAt": f"2026-07-15T09:00:{second:02d}.000000Z",
            "body": body,
            "seq": seq,
        }
        for seq, (turn_id, body, second) in enumerate(spec, start=1)
    ]


OLD = turns(
    ("t1", "one", 10),
    ("t2", "two", 20),
    ("t3", "three, cut short", 30),
    ("t4", "four", 40),
    ("made-up", "a turn the old parser made up", 45),
)
NEW = turns(
    ("t1", "one", 10),
    ("x", "interrupted", 15),  # the new parser counts an interrupted turn
    ("t2", "two", 20),
    ("t3", "three, the whole reply", 31),  # the whole reply, completed at its last line
    ("t4", "four", 40),
)
NEXT = turns(*[(t["turnId"], t["body"], int(t["completedAt"][17:19])) for t in NEW], ("t5", "five", 50))[-1:]


def jsonl(lines: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(line) + "\n" for line in lines)


def test_a_thread_re_sent_by_a_newer_parser_is_corrected_never_quarantined(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    db = str(tmp_path / "p.duckdb")

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        done = cli(kafka_bootstrap, kafka_topic_name, *args, stdin=stdin)
        assert done.returncode == 0, done.stderr
        return done

    def read(*extra: str) -> dict[str, Any]:
        doc = json.loads(run("read", "--project", PROJECT, "--db", db, "--wait", "0", "--limit", "100", *extra).stdout)
        assert isinstance(doc, dict)
        return doc

    def project() -> None:
        run("project", "--until-caught-up", "--db", db)

    run("ingest", "-", stdin=jsonl(OLD))
    project()
    first = read()
    assert first["status"] == "ok" and [t["body"] for t in first["turns"]] == [t["body"] for t in OLD]
    past_the_change = first["throughCursor"]  # an Observer that read the old chain whole

    run("ingest", "-", stdin=jsonl(NEW))
    run("ingest", "-", stdin=jsonl(NEXT))  # the thread goes on, numbered by the new parser
    project()

    listing = json.loads(run("quarantine", "--json", "--db", db).stdout)
    assert listing["records"] == [] and listing["brokenSources"] == [], listing
    assert listing["counts"]["records"] == 0 and listing["counts"]["brokenSources"] == 0

    stale = read("--after", past_the_change)  # its cursor is no longer a prefix of the chain
    assert stale["status"] == "resync_required" and stale["turns"] == [], stale

    fresh = read()
    expected = [*NEW, *NEXT]
    assert fresh["status"] == "ok" and fresh["page"]["complete"]
    assert [(t["seq"], t["body"], t["completedAt"]) for t in fresh["turns"]] == [
        (t["seq"], t["body"], t["completedAt"]) for t in expected
    ]
