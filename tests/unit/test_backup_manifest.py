"""A log backup's manifest: its document, the checks an import relies on, and where an export resumes
after a crash (``throughline.backup.manifest``, ``throughline.backup.export``; no broker)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from throughline.backup.exceptions import (
    BackupDamagedError,
    BackupLogGapError,
    BackupTopicMismatchError,
)
from throughline.backup.export import _resume_points
from throughline.backup.files import FileEntry, SegmentWriter, file_name
from throughline.backup.manifest import (
    MANIFEST,
    Manifest,
    PartitionEntry,
    load_manifest,
    parse_manifest,
    save_manifest,
    unlisted_files,
    verify_files,
)
from throughline.log.record_copy import StoredRecord


def _records(partition: int, offsets: range) -> list[StoredRecord]:
    return [StoredRecord(partition, o, 1_000 + o, 0, b"k", b"v" * 100, ()) for o in offsets]


def _file(root: Path, partition: int, offsets: range) -> FileEntry:
    writer = SegmentWriter(root, "t", partition, offsets[0])
    writer.write(_records(partition, offsets))
    entry = writer.finish()
    assert entry is not None
    return entry


def _manifest(root: Path) -> Manifest:
    a = _file(root, 0, range(0, 10))
    b = _file(root, 0, range(12, 20))  # 10, 11: an aborted transaction's records and its marker
    return Manifest("t", "id-1", 2, {0: PartitionEntry(0, 22, 22, (a, b))})


def test_the_manifest_round_trips_through_its_document(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path)
    save_manifest(tmp_path, manifest)
    doc = json.loads((tmp_path / MANIFEST).read_text())
    assert doc["format"] == "throughline.log-backup" and doc["version"] == 1
    assert doc["recordSchema"] == "log_backup_record.v1"
    assert doc["partitions"]["0"]["records"] == 18
    assert doc["partitions"]["0"]["files"][1]["firstOffset"] == 12
    assert load_manifest(tmp_path) == manifest
    assert manifest.partitions[0].complete


def test_no_manifest_is_a_new_backup(tmp_path: Path) -> None:
    assert load_manifest(tmp_path) is None


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.update(format="other"),
        lambda d: d.update(version=2),
        lambda d: d.pop("topic"),
        lambda d: d["partitions"]["0"]["files"][1].update(firstOffset=5),  # overlaps the file before
        lambda d: d["partitions"]["0"].update(nextOffset=15),  # inside its last file
        lambda d: d["partitions"].update({"7": d["partitions"]["0"]}),  # not one of the topic's partitions
        lambda d: d["partitions"]["0"]["files"][0].update(records=11),  # more records than offsets
        lambda d: d["partitions"]["0"]["files"][0].update(sha256=3),
    ],
)
def test_a_manifest_that_contradicts_itself_is_damaged(tmp_path: Path, change: object) -> None:
    doc = _manifest(tmp_path).to_json()
    change(doc)  # type: ignore[operator]
    with pytest.raises(BackupDamagedError):
        parse_manifest(doc)


def test_a_manifest_that_is_not_json_is_damaged(tmp_path: Path) -> None:
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(BackupDamagedError):
        load_manifest(tmp_path)


def test_files_are_verified_by_size_and_digest(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path)
    verify_files(tmp_path, manifest, [0])
    path = tmp_path / manifest.partitions[0].files[0].name
    data = bytearray(path.read_bytes())
    data[-20] ^= 1  # one bit, same size
    path.write_bytes(bytes(data))
    with pytest.raises(BackupDamagedError, match="SHA-256"):
        verify_files(tmp_path, manifest, [0])
    path.unlink()
    with pytest.raises(BackupDamagedError, match="missing"):
        verify_files(tmp_path, manifest, [0])


def test_another_topic_is_refused() -> None:
    manifest = Manifest("t", "id-1", 3)
    manifest.check_source("t", "id-1", 3)
    for other in (("u", "id-1", 3), ("t", "id-2", 3), ("t", "id-1", 4)):
        with pytest.raises(BackupTopicMismatchError):
            manifest.check_source(*other)


def test_a_new_backup_starts_where_the_log_begins(tmp_path: Path) -> None:
    manifest, salvaged = _resume_points(tmp_path, Manifest("t", "id", 2), [0, 1], {0: 0, 1: 5}, {0: 10, 1: 50})
    assert salvaged == []
    assert manifest.partitions[0] == PartitionEntry(0, 0, 10)
    assert manifest.partitions[1] == PartitionEntry(5, 5, 50)


def test_a_crashed_run_resumes_after_the_last_whole_block(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path)
    manifest = replace(manifest, partitions={0: replace(manifest.partitions[0], end_offset=22)})
    # The crashed run wrote 22..59 in 4 blocks; the crash tore the last one.
    writer = SegmentWriter(tmp_path, "t", 0, 22)
    for start in range(22, 60, 10):
        writer.write(_records(0, range(start, min(start + 10, 60))))
        writer._writer.flush()
    writer.finish()
    path = tmp_path / file_name(0, 22)
    path.write_bytes(path.read_bytes()[:-5])
    assert unlisted_files(tmp_path, manifest, 0) == [file_name(0, 22)]
    resumed, salvaged = _resume_points(tmp_path, manifest, [0], {0: 0}, {0: 80})
    assert salvaged == [file_name(0, 22)]
    entry = resumed.partitions[0]
    assert entry.next_offset == 52  # 22..51 whole on disk: no record twice, none missing
    assert entry.end_offset == 80 and not entry.complete
    assert entry.files[-1].records == 30
    verify_files(tmp_path, resumed, [0])


def test_a_resume_point_the_log_no_longer_holds_is_a_gap(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path)
    with pytest.raises(BackupLogGapError):
        _resume_points(tmp_path, manifest, [0], {0: 30}, {0: 40})


def test_a_log_shorter_than_the_backup_is_another_log(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path)
    with pytest.raises(BackupTopicMismatchError):
        _resume_points(tmp_path, manifest, [0], {0: 0}, {0: 15})


def test_an_import_chooses_complete_partitions_the_backup_holds(tmp_path: Path) -> None:
    from throughline.backup.exceptions import BackupIncompleteError
    from throughline.backup.export import chosen_partitions
    from throughline.backup.restore import _chosen
    from throughline.errors import InvalidArgumentsError

    manifest = _manifest(tmp_path)
    stopped = replace(manifest, partitions={**manifest.partitions, 1: PartitionEntry(0, 5, 9)})
    assert _chosen(manifest, None, False) == [0]
    with pytest.raises(BackupIncompleteError, match=r"\[1\]"):
        _chosen(stopped, None, False)
    assert _chosen(stopped, None, True) == [0, 1]
    assert _chosen(stopped, [0, 0], False) == [0]
    with pytest.raises(InvalidArgumentsError):
        _chosen(manifest, [1], False)
    assert chosen_partitions(None, 3, "t") == [0, 1, 2]
    assert chosen_partitions([2, 0, 2], 3, "t") == [0, 2]
    with pytest.raises(InvalidArgumentsError):
        chosen_partitions([3], 3, "t")
