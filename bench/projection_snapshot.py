"""Projection snapshots against a replay from offset 0 (docs/operations.md "Projection snapshots").

``python -m bench.projection_snapshot --turns 200000``: a real broker (``THROUGHLINE_TEST_BOOTSTRAP_SERVERS``,
else one started here), one topic of 6 partitions with ``--turns`` turns of 1 KiB bodies (the bench's
``Workload``). Each step is a real ``throughline`` process, timed wall-clock:

1. ``replay`` into a new file: the time a new projection takes from offset 0;
2. ``snapshot`` of that file (every partition), and of half the partitions;
3. ``load-snapshot`` into a new file (digests, topic id and end offsets checked), then
   ``project --until-caught-up`` on it (nothing new to apply: the cost of starting from the snapshot).

The loaded file's ``table_digests`` must equal the replayed one's (checked). Prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import PYTHON, Workload, broker, encode_workload, fill_topic, human_count, log, new_topic_name

PARTITIONS = 6


def _run(*argv: str, env: dict[str, str]) -> tuple[float, dict[str, object]]:
    started = time.perf_counter()
    done = subprocess.run(
        [PYTHON, "-m", "throughline.cli", *argv], capture_output=True, text=True, env=env, timeout=3600, check=False
    )
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"throughline {' '.join(argv)} failed: {done.stderr[-2000:]}")
    return took, json.loads(done.stdout.strip().splitlines()[-1])


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*")) if path.is_dir() else path.stat().st_size


def main(argv: list[str] | None = None) -> int:
    """Run the measurement and print its table."""
    parser = argparse.ArgumentParser(prog="python -m bench.projection_snapshot")
    parser.add_argument("--turns", type=int, default=200_000)
    args = parser.parse_args(argv)
    workload = Workload(turns=args.turns, label="snap")
    log(f"encoding {human_count(args.turns)} turns")
    data = encode_workload(workload, PARTITIONS)
    with broker() as bootstrap, tempfile.TemporaryDirectory(prefix="bench-snapshot-") as tmp:
        topic = new_topic_name("snapshot")
        log(f"filling {topic}")
        fill_topic(bootstrap, topic, data, PARTITIONS)
        env = {**os.environ, "THROUGHLINE_BOOTSTRAP_SERVERS": bootstrap, "THROUGHLINE_TOPIC": topic}
        work = Path(tmp)
        replayed, loaded = work / "replayed.duckdb", work / "loaded.duckdb"
        log("replay from offset 0")
        t_replay, _ = _run("replay", "--db", str(replayed), env=env)
        log("snapshot")
        t_snap, _ = _run("snapshot", "--db", str(replayed), "--out", str(work / "cut"), env=env)
        t_half, _ = _run(
            "snapshot", "--db", str(replayed), "--out", str(work / "half"), "--partitions", "0,1,2", env=env
        )
        log("load-snapshot + project --until-caught-up")
        t_load, _ = _run("load-snapshot", "--from", str(work / "cut"), "--db", str(loaded), env=env)
        t_catch, summary = _run("project", "--until-caught-up", "--db", str(loaded), env=env)
        assert summary["records"] == 0, summary
        from throughline.projector.store import DuckProjection

        with DuckProjection.open(replayed, read_only=True) as a, DuckProjection.open(loaded, read_only=True) as b:
            assert a.table_digests() == b.table_digests(), "the loaded projection differs from the replayed one"
        total = t_snap + t_load + t_catch
        rows = [
            ("replay from offset 0 (new file, caught up)", t_replay),
            ("snapshot, every partition", t_snap),
            ("snapshot, 3 of 6 partitions", t_half),
            ("load-snapshot (verify + build the file)", t_load),
            ("project --until-caught-up on the loaded file", t_catch),
            ("snapshot + load + catch up", total),
        ]
        print(
            f"\nprojection snapshots, {human_count(args.turns)} turns of 1 KiB, {PARTITIONS} partitions, {os.cpu_count()} cores:"
        )
        for name, seconds in rows:
            print(f"  {name:<48} {seconds:7.1f} s")
        print(f"  {'snapshot + load + catch up / replay':<48} {total / t_replay:7.2f} x")
        print(f"  {'(load + catch up alone) / replay':<48} {(t_load + t_catch) / t_replay:7.2f} x")
        print(
            f"  sizes: projection file {_size(replayed) / 1e6:.0f} MB, snapshot {_size(work / 'cut') / 1e6:.0f} MB, "
            f"loaded file {_size(loaded) / 1e6:.0f} MB"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
