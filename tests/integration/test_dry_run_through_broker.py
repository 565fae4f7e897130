"""``ingest --dry-run`` against a real broker: its output, fed to ``throughline ingest -``, appends the very
records the host-format ingest appends (ids, seqs, times, bodies, digests, attributes), in the same order.

The dry run itself is given a bootstrap server that refuses every connection: it must not need one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from support.topic import Stored, closed_port, read_topic

CLI = str(Path(sys.executable).with_name("throughline"))
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
RUN_TIMEOUT_S = 120.0


def run(bootstrap: str, topic: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "THROUGHLINE_BOOTSTRAP_SERVERS": bootstrap, "THROUGHLINE_TOPIC": topic}
    env.pop("THROUGHLINE_DB", None)
    return subprocess.run(
        [CLI, "ingest", *args], input=stdin, env=env, capture_output=True, timeout=RUN_TIMEOUT_S, check=False
    )


def facts(records: list[Stored]) -> list[tuple[object, ...]]:
    out = []
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        t = r.turn
        out.append(
            (
                t.project,
                t.host,
                t.thread,
                t.turn_id,
                t.seq,
                t.completed_at_micros,
                t.body,
                t.content_digest,
                dict(t.producer.attributes),
                t.producer.name,
                r.key,
            )
        )
    return out


def test_dry_run_output_fed_back_appends_the_same_records(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    root = tmp_path / "projects"
    shutil.copytree(FIXTURES / "claude-code" / "projects", root)
    dry = run(f"127.0.0.1:{closed_port()}", kafka_topic_name, "--format", "claude-code", str(root), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert len(dry.stdout.splitlines()) == 13

    direct_topic = kafka_topic_name + "-direct"
    direct = run(kafka_bootstrap, direct_topic, "--format", "claude-code", str(root))
    assert direct.returncode == 0, direct.stderr
    fed = run(kafka_bootstrap, kafka_topic_name, "-", stdin=dry.stdout)
    assert fed.returncode == 0, fed.stderr

    expected = facts(read_topic(kafka_bootstrap, direct_topic))
    assert len(expected) == 13
    assert facts(read_topic(kafka_bootstrap, kafka_topic_name)) == expected
