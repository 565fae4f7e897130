"""Smoke test of the benchmark command: ``python -m bench --quick`` for two measurements, against the real
broker. It asserts that the suite runs and writes a well-formed report, never how fast anything is."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_quick_bench_writes_a_report(kafka_bootstrap: str, tmp_path: Path) -> None:
    report = tmp_path / "benchmarks.md"
    env = dict(os.environ, THROUGHLINE_TEST_BOOTSTRAP_SERVERS=kafka_bootstrap)
    proc = subprocess.run(
        [
            sys.executable, "-m", "bench", "--quick", "--only", "producer,reader", "--profile", "none",
            "--report", str(report), "--workdir", str(tmp_path / "work"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = report.read_text(encoding="utf-8")
    assert text.startswith("# Benchmarks")
    assert "python -m bench --quick --only producer,reader" in text  # the reproduce command
    for heading in ("## Targets", "## Machine", "## 3. Reader cost", "## 5. Producer"):
        assert heading in text
    # Every target of the two measurements has a verdict, and the reader measured all four cells.
    verdicts = re.findall(r"^\| [35] \| .+ \| \*\*(PASS|MISS)\*\* \|$", text, flags=re.M)
    assert len(verdicts) == 5, text
    assert "identical `turns`" in text  # the bulk builder matched the projector's apply path
    assert not (tmp_path / "work").exists()  # scratch files are removed
