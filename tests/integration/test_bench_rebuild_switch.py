"""Smoke test of the benchmark's rebuild-switch item (``python -m bench.rebuild_switch``, docs/benchmarks.md
item 9), short and slow, against the session's broker: it runs its three cells on a new ``serve`` (without
a rebuild, with one posted as the measurement starts, without again), the rebuild switches, every read
and long-poll answer of every cell is ``ok`` (item 5's first target), and it prints its table. No timing
is asserted (the p99 figure is the standalone run's, in docs/benchmarks.md)."""

from __future__ import annotations

import json

from support.bench_run import failure, run_bench


def test_the_rebuild_switch_item_switches_and_every_read_is_ok(kafka_bootstrap: str) -> None:
    proc = run_bench(
        ["bench.rebuild_switch", "--bootstrap-servers", kafka_bootstrap]
        + ["--rate", "300", "--projects", "8", "--seconds", "6", "--repeat", "1"]
    )
    assert proc.returncode == 0, failure(proc)
    cells = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [c["rebuild"] for c in cells] == [False, True, False], proc.stdout[-3000:]
    for c in cells:
        assert c["reads"] > 0 and set(c["statuses"]) == {"ok"}, c["statuses"]
        assert set(c["follow_statuses"]) <= {"ok"}, c["follow_statuses"]
    rebuilt = cells[1]
    assert rebuilt["rebuild_phase"] == "switched", rebuilt.get("rebuild_phase")
    assert "| 1 | 300/s + rebuild |" in proc.stdout and "read p99 median:" in proc.stdout
