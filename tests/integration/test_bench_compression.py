"""Smoke test of the benchmark's compression item (``python -m bench compression``, item 7): it runs
against the session's broker and prints its section; no timing is asserted. And the bodies it measures
are transcript-shaped text, as the item claims, not random bytes."""

from __future__ import annotations

import random
import re
import sys
import zlib
from pathlib import Path

from support.bench_run import failure, run_bench

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # the bench package lives beside the tests, not in the installed package
    sys.path.insert(0, str(REPO))
from bench.compression import CODECS, transcript_body  # noqa: E402


def test_the_bodies_are_transcript_shaped_text() -> None:
    rng = random.Random(5)
    bodies = [transcript_body(rng) for _ in range(200)]
    text = "\n".join(bodies)
    assert len(set(bodies)) == len(bodies)  # no two turns alike
    for mark in (
        "```python",
        "$ ",
        "[100%]",
        "+++ b/",
        '"tool": ',
    ):  # code, commands, test runs, diffs, tools
        assert mark in text
    assert sum(len(b) for b in bodies) / len(bodies) > 1000
    ratio = len(zlib.compress(text.encode("utf-8"), 6)) / len(text.encode("utf-8"))
    assert 0.15 < ratio < 0.5  # compressible as text is; random bytes would not be


def test_the_compression_item_prints_every_codec(kafka_bootstrap: str) -> None:
    proc = run_bench(["bench", "compression", "--turns", "300", "--repeat", "1"], bootstrap=kafka_bootstrap)
    assert proc.returncode in (0, 1), failure(proc)  # 1: a target missed
    out = proc.stdout
    assert "## 7. Compression" in out and "python -m bench compression --turns 300 --repeat 1" in out
    for codec in CODECS:
        assert re.search(rf"^\| {codec}\b.*\| [0-9.]+ \|$", out, re.MULTILINE), codec
    assert "bytes on the broker <= 0.4x uncompressed" in out
