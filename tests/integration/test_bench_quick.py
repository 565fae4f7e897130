"""Smoke tests of the benchmark command: ``python -m bench --quick`` for some measurements, against the real
broker. They assert that the suite runs and writes a well-formed report, and (the freshness sweep) what the
contract promises about reads under steady ingest, never how fast anything is."""

from __future__ import annotations

import re
from pathlib import Path

from support.bench_run import failure, run_bench


def _quick_bench(kafka_bootstrap: str, tmp_path: Path, only: str, timeout: float) -> str:
    """Run ``python -m bench --quick --only ONLY`` against the session's broker; return the report."""
    report = tmp_path / "benchmarks.md"
    proc = run_bench(
        [
            "bench",
            "--quick",
            "--only",
            only,
            "--profile",
            "none",
            "--report",
            str(report),
            "--workdir",
            str(tmp_path / "work"),
        ],
        bootstrap=kafka_bootstrap,
        timeout=timeout,
    )
    assert proc.returncode == 0, failure(proc)
    return report.read_text(encoding="utf-8")


def test_quick_bench_writes_a_report(kafka_bootstrap: str, tmp_path: Path) -> None:
    text = _quick_bench(kafka_bootstrap, tmp_path, "producer,reader", timeout=300)
    assert text.startswith("# Benchmarks")
    assert "python -m bench --quick --only producer,reader" in text  # the reproduce command
    for heading in ("## Targets", "## Machine", "## 3. Reader cost", "## 5. Producer"):
        assert heading in text
    # Every target of the two measurements has a verdict: the reader's four p99 ratios and its first
    # page's p50 and p99 (snapshot and delta), the producer's ratio.
    verdicts = re.findall(r"^\| [35] \| .+ \| \*\*(PASS|MISS)\*\* \|$", text, flags=re.M)
    assert len(verdicts) == 9, text
    assert "identical `turns`" in text  # the bulk builder matched the projector's apply path
    assert not (tmp_path / "work").exists()  # scratch files are removed


_CELL = re.compile(
    r"^\| (?P<rate>[\d,]+/s) \| (?P<projects>\d+) \| [\d,]+ \(\d+\) \| [^|]+ \| [^|]+ "
    r"\| (?P<samples>[\d,]+) \((?P<missed>[\d,]+), [\d,]+\) \| [^|]+ "
    r"\| (?P<ok>[\d,]+) of (?P<reads>[\d,]+) \([^|]*\) \| (?P<follow_p50>[^|/]+)/ (?P<follow_p99>[^|(]+) "
    r"\((?P<followed>[\d,]+)\) \| [^|]+ \| [^|]+ "
    r"\| (?P<txn_per_s>[\d,]+)/s, (?P<txn_records>[\d,.]+), [\d,.]+ ms, (?P<busy>\d+)% \| (?:PASS|MISS[^|]*) \|$",
    flags=re.M,
)


def _n(text: str) -> int:
    return int(text.replace(",", ""))


def test_quick_freshness_sweep_reads_fresh_turns_ok(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The freshness sweep (item 4) in small: 100 and 1,000 turns/s, one busy project and 64, 3 s a cell.

    No latency is asserted. What is asserted is correctness the contract promises at these rates, far
    below the projector's capacity: every acknowledged turn a poller followed became readable (within the
    bench's 10 s bound), and almost every first-page read under steady ingest answered `ok`
    (docs/spec.md#freshness-steady-ingest) -- before the freshness rework most were `projection_pending`."""
    text = _quick_bench(kafka_bootstrap, tmp_path, "freshness", timeout=400)
    assert "## 4. Freshness at every rate" in text
    section = text.split("## 4. Freshness at every rate", 1)[1].split("\n## ", 1)[0]
    cells = [m.groupdict() for m in _CELL.finditer(section)]
    assert [(c["rate"], c["projects"]) for c in cells] == [
        ("100/s", "1"),
        ("100/s", "64"),
        ("1,000/s", "1"),
        ("1,000/s", "64"),
    ], section
    for c in cells:
        where = f"{c['rate']} x {c['projects']} projects"
        assert _n(c["samples"]) > 0, f"{where}: no acknowledged turn was seen readable\n{section}"
        assert _n(c["missed"]) == 0, f"{where}: acknowledged turns never became readable\n{section}"
        reads, ok = _n(c["reads"]), _n(c["ok"])
        assert reads > 0
        assert ok >= 0.999 * reads, f"{where}: {reads - ok} of {reads} first-page reads were not ok\n{section}"
        # The long-poll follower (item 4) was delivered every turn of its project: a finite p99.
        late = c["follow_p99"].strip()
        assert _n(c["followed"]) > 0 and not late.startswith((">", "n/a")), (
            f"{where}: the long-poll missed turns\n{section}"
        )
        # serve's transaction histograms (/metrics) measured the projector while the producers sent.
        assert _n(c["txn_per_s"]) > 0 and float(c["txn_records"].replace(",", "")) >= 1, section
        assert 0 < int(c["busy"]) <= 100, section
    # Six targets with a verdict each: the sweep's four (the half-capacity cells are not part of the
    # quick sweep; the last is that the producers sent the rate asked) and the idle serve's two.
    verdicts = re.findall(r"^\| 4 \| .+ \| \*\*(PASS|MISS)\*\* \|$", text, flags=re.M)
    assert len(verdicts) == 6, section
    # The delays count from the broker's append (a LogAppendTime topic): every cell says how long after
    # it the producers stamped their acknowledgements, a finite figure.
    stamps = re.search(r"after the broker appended its batch [^:]+ per cell: (.+?)\.$", section, flags=re.M)
    assert stamps is not None and len(re.findall(r"[\d.]+ / [\d.]+ ms", stamps.group(1))) == 4, section
    assert not (tmp_path / "work").exists()
    # After the sweep, first pages of an idle serve over HTTP: all ok, with a verdict on both targets.
    assert re.search(r"^- Idle reads: .+: ok [\d,]+ \(item 4's idle HTTP target", section, flags=re.M), section
    idle = re.findall(
        r"^\| 4 \| first page over HTTP on an idle serve p[59][09] .+ \*\*(PASS|MISS)\*\* \|$", text, flags=re.M
    )
    assert len(idle) == 2, text


def test_small_writes_bench_runs_both_write_paths_to_equal_tables() -> None:
    """``python -m bench.small_writes``: the writes of the store before (registered Arrow tables) and now
    (``execute_over``), both with the store's VALUES bound, applied to the same batches, leave equal tables
    (exit 1 if they differ), timed by CPU alone and by wall time beside a busy thread; and source rows
    written at every append against at milestones only leave the same heads and other tables; and the
    writer's statements parsed by each execution against once leave equal tables."""
    equal = "both projections' table_digests equal"
    same_heads = "both projections' other tables equal and every source's head read equal"
    for extra, unit, verdict in (
        ([], "ms CPU", equal),
        (["--contended", "1"], "ms wall", equal),
        (["--compare", "milestones", "--projects", "1"], "ms CPU", same_heads),
        (["--compare", "parsed"], "ms CPU", equal),
    ):
        proc = run_bench(["bench.small_writes", "--rounds", "2", *extra], timeout=180)
        assert proc.returncode == 0, failure(proc)
        assert "| 1 |" in proc.stdout and verdict in proc.stdout
        assert unit in proc.stdout.splitlines()[0]


def test_busy_reads_bench_reads_ok_beside_a_writer_both_ways() -> None:
    """``python -m bench.busy_reads``: first pages beside a busy writer with quiet views stopped at BEGIN
    (as before) and at COMMIT (as now), alternated; every read answers ok (exit 1 otherwise)."""
    proc = run_bench(["bench.busy_reads", "--rounds", "1", "--seconds", "0.5"], timeout=180)
    assert proc.returncode == 0, failure(proc)
    rows = re.findall(r"^\| at (BEGIN|COMMIT) \| ([\d,]+) \|", proc.stdout, flags=re.M)
    assert [way for way, _ in rows] == ["BEGIN", "COMMIT"] and all(int(n.replace(",", "")) > 0 for _, n in rows), (
        proc.stdout
    )
    assert "ratio (at COMMIT / at BEGIN)" in proc.stdout and "every read ok" in proc.stdout
