"""Smoke test of the benchmark's member-join item (``python -m bench member-join --quick``, item 10): a
member joining a ``serve --group`` from a peer's snapshot and from offset 0, against the session's broker.
It asserts that the item runs both paths (the member loads every partition it holds from the peer's
snapshot with peer bootstrap on, and never asks a peer with ``THROUGHLINE_GROUP_PEER_BOOTSTRAP=off``: the
bench itself fails when the member's log says otherwise) and prints its section; no timing is asserted."""

from __future__ import annotations

import re
from pathlib import Path

from support.bench_run import failure, run_bench


def test_the_member_join_item_times_both_paths(kafka_bootstrap: str, tmp_path: Path) -> None:
    proc = run_bench(
        ["bench", "member-join", "--quick", "--workdir", str(tmp_path / "work")], bootstrap=kafka_bootstrap
    )
    assert proc.returncode == 0, failure(proc)
    out = proc.stdout
    assert "## 10. A member joining: from a peer's snapshot against from offset 0" in out
    assert "python -m bench member-join --quick" in out
    # One pair at 3k turns over 3 partitions: the joiner (copies 2) holds all three, each loaded from A's
    # snapshot on the snapshot path; a ratio of the pair; every step of the breakdown.
    row = re.search(r"^\| 3k \| 1 \| [\d.]+ \| 3/3 \| [\d.]+ \| ([\d.]+) \| ([\d.]+) \|", out, re.MULTILINE)
    assert row and float(row.group(1)) > 0, out
    for step in ("fetch", "unpack", "verify", "load"):
        assert re.search(rf"^\| {step} \| [\d.]+ \| \d+% \|$", out, re.MULTILINE), step
    assert "time to live from a peer's snapshot <= 0.15x from offset 0" in out
    assert not (tmp_path / "work").exists()  # the members' files and the scratch files are removed
