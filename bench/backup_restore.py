"""Log backup and restore figures (docs/operations.md, "Backup and restore"): time and bytes of
``export_log`` and ``import_backup`` for N transcript-shaped turns, against the topic's bytes on the broker.

Run alone: ``.venv/bin/python -m bench.backup_restore --turns 100000`` (a broker is started here unless
``THROUGHLINE_TEST_BOOTSTRAP_SERVERS`` names one). Prints one markdown table. Each run uses fresh topics,
deleted afterwards, and a temporary backup folder.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import broker, delete_topics, end_offsets, log, new_topic_name
from bench.compression import log_bytes, transcript_turns
from throughline.backup import export_log, import_backup
from throughline.producers.producer import TurnProducer
from throughline.projector.replay import replay

PARTITIONS = 3


def _folder_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def measure(bootstrap: str, turns_count: int, repeat: int) -> list[dict[str, float]]:
    """One row per repetition: seconds and bytes of export, import and a replay of the restored topic."""
    log(f"backup: generating {turns_count:,} transcript-shaped turns")
    turns = transcript_turns(turns_count)
    body_bytes = sum(len(t.body.encode("utf-8")) for t in turns)
    rows = []
    for rep in range(repeat):
        source, copy = new_topic_name("backup-src"), new_topic_name("backup-copy")
        try:
            with TurnProducer(bootstrap, source, partitions=PARTITIONS) as producer:
                producer.send_many(turns)
            topic_bytes = log_bytes(bootstrap, source)
            with tempfile.TemporaryDirectory(prefix="tl-backup-bench-") as tmp:
                out = Path(tmp) / "backup"
                start = time.perf_counter()
                exported = export_log(bootstrap, source, out)
                export_s = time.perf_counter() - start
                backup_bytes = _folder_bytes(out)
                start = time.perf_counter()
                restored = import_backup(bootstrap, out, copy)
                import_s = time.perf_counter() - start
                if sum(end_offsets(bootstrap, copy).values()) != turns_count or not restored.complete:
                    raise RuntimeError(f"{copy} does not hold {turns_count} records")
                copy_bytes = log_bytes(bootstrap, copy)
                start = time.perf_counter()
                replay(bootstrap, copy, Path(tmp) / "replayed.duckdb")
                replay_s = time.perf_counter() - start
            rows.append(
                {
                    "turns": turns_count,
                    "body_bytes": body_bytes,
                    "topic_bytes": topic_bytes,
                    "backup_bytes": backup_bytes,
                    "copy_bytes": copy_bytes,
                    "export_s": export_s,
                    "import_s": import_s,
                    "replay_s": replay_s,
                    "export_records": sum(exported.records.values()),
                }
            )
            log(
                f"backup: run {rep + 1}/{repeat}: export {export_s:.2f}s, import {import_s:.2f}s, replay {replay_s:.2f}s"
            )
        finally:
            delete_topics(bootstrap, [source, copy])
    return rows


def render(rows: Sequence[dict[str, float]]) -> str:
    """The markdown table of the runs."""
    out = [
        "| turns | body MB | topic MB (broker) | backup MB | x topic | export s | export turns/s "
        "| import s | import turns/s | restored topic MB | replay of the restored topic s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    mb = 1024 * 1024
    for r in rows:
        out.append(
            f"| {int(r['turns']):,} | {r['body_bytes'] / mb:.1f} | {r['topic_bytes'] / mb:.1f} "
            f"| {r['backup_bytes'] / mb:.1f} | {r['backup_bytes'] / r['topic_bytes']:.2f} "
            f"| {r['export_s']:.2f} | {r['turns'] / r['export_s']:,.0f} | {r['import_s']:.2f} "
            f"| {r['turns'] / r['import_s']:,.0f} | {r['copy_bytes'] / mb:.1f} | {r['replay_s']:.2f} |"
        )
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.backup_restore``: run and print the table."""
    p = argparse.ArgumentParser(prog="python -m bench.backup_restore", description=__doc__)
    p.add_argument("--turns", type=int, default=100_000, help="turns in the topic (default 100,000)")
    p.add_argument("--repeat", type=int, default=3, help="runs (default 3)")
    a = p.parse_args(argv)
    with broker() as bootstrap:
        rows = measure(bootstrap, a.turns, max(1, a.repeat))
    sys.stdout.write(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
