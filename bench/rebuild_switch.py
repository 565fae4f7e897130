"""Reads during a rebuild's switch against the same cell without one (the freshness sweep's rig).

    .venv/bin/python -m bench.rebuild_switch --bootstrap-servers HOST:PORT [--rate 1000] [--projects 64]
        [--seconds 10] [--repeat 2]

Each repetition starts a new ``serve`` over a new topic (``bench.freshness_rig.Rig``: open-loop producer
processes, pollers reading first pages until their acknowledged turn is readable, a long-poll follower)
and runs three cells of ``--rate`` turns/s over ``--projects`` projects: one without a rebuild, one with
a rebuild started (``POST /v1/admin/rebuild``) as its measurement starts, whose switch lands inside the
measured seconds, and one more without (after the switch: reads on the rebuilt file). ``serve``
switches files once per run, hence a new one per repetition. It prints one JSON line per cell and a
markdown table (docs/benchmarks.md, "9. Reads during a rebuild's switch").
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.common import Config, percentile
from bench.freshness_rig import Rig

SWITCH_BOUND_S = 120.0


def _rebuild(url: str, measure_from: float, out: dict[str, Any]) -> None:
    """Start a rebuild when the cell's measurement starts; follow it to its switch (bounded)."""
    time.sleep(max(0.0, measure_from - time.monotonic()))
    out["posted"] = time.monotonic()
    request = urllib.request.Request(url + "/v1/admin/rebuild", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        out["post_status"] = response.status
    deadline = time.monotonic() + SWITCH_BOUND_S
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url + "/v1/admin/rebuild", timeout=30) as response:
            status = json.loads(response.read())
        if status["phase"] in ("switched", "failed"):
            out["status"] = status
            out["switched_at"] = time.monotonic()
            return
        time.sleep(0.05)


class _RebuildRig(Rig):
    topic_prefix = "rebuild"


def _cell(rig: Rig, cell: int, rate: float, projects: int, rebuild: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    thread: threading.Thread | None = None
    if rebuild:
        # The cell's measurement starts warm-up seconds after its producers; the rig sets ``measure_from``
        # only inside run_cell, so the rebuild is posted that long after the call (plus building the load).
        def later() -> None:
            for _ in range(6000):
                current = rig.current
                if current is not None and current.measure_from < math.inf:
                    _rebuild(rig.url, current.measure_from, out)
                    return
                time.sleep(0.01)

        thread = threading.Thread(target=later, daemon=True)
        thread.start()
    started = time.monotonic()
    r = rig.run_cell(cell, rate, projects, label=f"{rate:g}/s" + (" + rebuild" if rebuild else ""))
    ended = time.monotonic()
    if thread is not None:
        thread.join(SWITCH_BOUND_S)
    r.pop("profile", None)
    r["rebuild"] = rebuild
    if rebuild:
        status = out.get("status", {})
        r["rebuild_phase"] = status.get("phase")
        r["paused_s"] = status.get("pausedSeconds")
        r["switch_in_cell"] = "switched_at" in out and started <= out["switched_at"] <= ended
        r["post_to_switch_s"] = out["switched_at"] - out["posted"] if "switched_at" in out else None
    return r


def _table(cells: list[dict[str, Any]]) -> str:
    rows = [
        "| repetition | cell | reads | statuses | read p50 ms | read p99 ms | ack -> readable p50 / p99 ms "
        "| long-poll answers | switch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        switch = ""
        if c["rebuild"]:
            switch = (
                f"{c['rebuild_phase']}, {'inside' if c['switch_in_cell'] else 'OUTSIDE'} the cell, "
                f"{c['post_to_switch_s']:.1f} s after the POST, projector paused {c['paused_s']} s"
            )
        rows.append(
            f"| {c['repetition']} | {c['label']} | {c['reads']:,} | {c['statuses']} | {c['read_p50']:.1f} "
            f"| {c['read_p99']:.1f} | {c['fresh_p50']:.0f} / {c['fresh_p99']:.0f} | {c['follow_statuses']} | {switch} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--projects", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    cfg = Config(freshness_seconds=args.seconds, freshness_warmup=1.0)
    cells: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rebuild-bench-") as work:
        for rep in range(1, args.repeat + 1):
            folder = Path(work) / f"r{rep}"
            folder.mkdir()
            rig = _RebuildRig(cfg, args.bootstrap_servers, folder)
            try:
                for i, rebuild in enumerate((False, True, False)):
                    r = _cell(rig, i, args.rate, args.projects, rebuild)
                    r["repetition"] = rep
                    cells.append(r)
                    print(json.dumps(r, default=str), flush=True)
            finally:
                rig.close()
    print(_table(cells))
    without = [c["read_p99"] for c in cells if not c["rebuild"]]
    during = [c["read_p99"] for c in cells if c["rebuild"]]
    print(f"read p99 median: without {percentile(without, 50):.1f} ms, during a switch {percentile(during, 50):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
