"""An export run's copy loop against a scripted source (no broker): it stops at its bound even when the
source returns later records, keeps the offsets' gaps, lists what it wrote when stopped, rolls files,
and gives up on a source that stalls (``throughline.backup.export``)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from throughline.backup.exceptions import ExportStalledError
from throughline.backup.export import _ExportRun
from throughline.backup.files import read_file
from throughline.backup.manifest import Manifest, PartitionEntry, load_manifest, verify_files
from throughline.log.record_copy import StoredRecord


class ScriptedSource:
    """A partition log (records at chosen offsets, and where the log ends) read a few records a poll."""

    def __init__(self, logs: dict[int, tuple[list[int], int]], per_poll: int = 3) -> None:
        self.logs = logs
        self.per_poll = per_poll
        self.positions: dict[int, int] = {}
        self.paused: set[int] = set()
        self.polls = 0

    def seek(self, partition: int, offset: int) -> None:
        self.positions[partition] = offset

    def position(self, partition: int) -> int:
        return self.positions[partition]

    def pause(self, partition: int) -> None:
        self.paused.add(partition)

    def read(self, timeout: float, max_records: int) -> dict[int, list[StoredRecord]]:
        self.polls += 1
        out: dict[int, list[StoredRecord]] = {}
        for p, (offsets, log_end) in self.logs.items():
            if p in self.paused or p not in self.positions:  # assigned the active partitions only
                continue
            due = [o for o in offsets if o >= self.positions[p]][: self.per_poll]
            if due:
                out[p] = [StoredRecord(p, o, 1000 + o, 0, b"k", b"v%d" % o, ()) for o in due]
                self.positions[p] = due[-1] + 1
            else:
                self.positions[p] = max(self.positions[p], log_end)  # past markers and aborted records
        if not out:
            time.sleep(0.001)  # a real poll waits out its timeout when nothing comes
        return out


def _run(tmp_path: Path, ends: dict[int, int], file_bytes: int = 1 << 20) -> _ExportRun:
    manifest = Manifest("t", "id", len(ends), {p: PartitionEntry(0, 0, e) for p, e in ends.items()})
    return _ExportRun(tmp_path, "t", manifest, sorted(ends), file_bytes)


def _offsets(tmp_path: Path, run: _ExportRun, partition: int) -> list[int]:
    return [r.offset for f in run.manifest.partitions[partition].files for r in read_file(tmp_path / f.name)]


def test_records_past_the_bound_are_not_written(tmp_path: Path) -> None:
    # The source holds 0..19 but the bound taken at the start is 12 (8 records were appended since).
    run = _run(tmp_path, {0: 12})
    source = ScriptedSource({0: (list(range(20)), 20)}, per_poll=5)
    run.copy(source, 10.0, None, None, 0.0)  # type: ignore[arg-type]
    run.close()
    assert _offsets(tmp_path, run, 0) == list(range(12))
    entry = run.manifest.partitions[0]
    assert entry.next_offset == 12 and entry.complete and 0 in source.paused
    assert load_manifest(tmp_path) == run.manifest


def test_gaps_are_kept_and_the_bound_is_reached_past_the_markers(tmp_path: Path) -> None:
    run = _run(tmp_path, {0: 16, 1: 0})
    source = ScriptedSource({0: ([0, 1, 2, 8, 9, 10], 16), 1: ([], 0)})
    progress: list[object] = []
    run.copy(source, 10.0, progress.append, None, 0.0)  # type: ignore[arg-type]
    run.close()
    assert _offsets(tmp_path, run, 0) == [0, 1, 2, 8, 9, 10]
    assert run.manifest.partitions[0].next_offset == 16 and run.manifest.partitions[0].complete
    assert run.manifest.partitions[1].files == () and run.manifest.partitions[1].complete
    assert progress and run.written == {0: 6, 1: 0}


def test_a_stopped_run_lists_what_it_wrote(tmp_path: Path) -> None:
    run = _run(tmp_path, {0: 30})
    stop = threading.Event()
    source = ScriptedSource({0: (list(range(30)), 30)}, per_poll=4)
    run.copy(source, 10.0, lambda _: stop.set(), stop, 0.0)  # type: ignore[arg-type]
    run.close()
    entry = load_manifest(tmp_path)
    assert entry is not None and entry.partitions[0].next_offset == 4 and not entry.partitions[0].complete
    verify_files(tmp_path, entry, [0])


def test_files_roll_at_their_size_and_each_is_listed(tmp_path: Path) -> None:
    run = _run(tmp_path, {0: 40}, file_bytes=1)  # every write of a poll finishes its file
    source = ScriptedSource({0: (list(range(40)), 40)}, per_poll=7)
    run.copy(source, 10.0, None, None, 0.0)  # type: ignore[arg-type]
    run.close()
    files = run.manifest.partitions[0].files
    assert len(files) == 6 and [f.first_offset for f in files] == [0, 7, 14, 21, 28, 35]
    assert _offsets(tmp_path, run, 0) == list(range(40))
    verify_files(tmp_path, run.manifest, [0])


def test_a_source_that_stalls_is_given_up(tmp_path: Path) -> None:
    run = _run(tmp_path, {0: 10})
    source = ScriptedSource({0: ([0, 1], 2)})  # the log says 10 but nothing past 2 ever comes
    started = time.monotonic()
    with pytest.raises(ExportStalledError):
        run.copy(source, 0.05, None, None, 0.0)  # type: ignore[arg-type]
    assert time.monotonic() - started < 10.0  # bounded by the stall timeout
    run.close()
    entry = load_manifest(tmp_path)
    assert entry is not None and entry.partitions[0].next_offset == 2 and not entry.partitions[0].complete


def test_a_resumed_run_starts_where_the_manifest_ends(tmp_path: Path) -> None:
    first = _run(tmp_path, {0: 5})
    first.copy(ScriptedSource({0: (list(range(9)), 9)}), 10.0, None, None, 0.0)  # type: ignore[arg-type]
    first.close()
    manifest = replace(first.manifest, partitions={0: replace(first.manifest.partitions[0], end_offset=9)})
    second = _ExportRun(tmp_path, "t", manifest, [0], 1 << 20)
    second.copy(ScriptedSource({0: (list(range(9)), 9)}), 10.0, None, None, 0.0)  # type: ignore[arg-type]
    second.close()
    assert _offsets(tmp_path, second, 0) == list(range(9)) and second.written == {0: 4}
