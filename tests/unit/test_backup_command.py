"""The command line of log backups without a broker: flags, progress lines, refusals before any
connection, and the records the import's client cannot write (``throughline.commands.backup``)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from throughline.backup.progress import CopyProgress, PartitionProgress
from throughline.backup.restore import import_backup
from throughline.cli import build_parser, main
from throughline.commands.backup import ProgressLines
from throughline.log.record_copy import StoredRecord, unwritable


def test_partitions_parse_as_a_list() -> None:
    args = build_parser().parse_args(["export", "--out", "d", "--partitions", "0,3"])
    assert args.partitions == [0, 3] and args.out == "d"
    args = build_parser().parse_args(["import", "d", "--topic", "new"])
    assert args.partitions is None and args.topic == "new" and not args.resume


@pytest.mark.parametrize("bad", ["a", "-1", ",", "1,x"])
def test_a_bad_partition_list_is_refused(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        build_parser().parse_args(["export", "--out", "d", "--partitions", bad])
    assert exit.value.code == 2
    assert json.loads(capsys.readouterr().err.strip().splitlines()[-1])["error"]["code"] == "invalid_arguments"


def test_import_needs_the_new_topic_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        build_parser().parse_args(["import", "d"])
    assert exit.value.code == 2 and "--topic" in capsys.readouterr().err


def test_a_folder_without_a_manifest_is_refused_before_any_connection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No broker listens on port 9; the refusal comes first.
    code = main(["import", str(tmp_path), "--topic", "new", "--bootstrap-servers", "127.0.0.1:9"])
    assert code == 2
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "backup_damaged"


def test_export_refuses_a_file_as_its_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    code = main(["export", "--out", str(target), "--bootstrap-servers", "127.0.0.1:9"])
    assert code == 2
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "backup_folder_invalid"


def test_progress_lines_show_each_partition_and_its_rate() -> None:
    stream = io.StringIO()
    lines = ProgressLines("export", stream)
    update = CopyProgress((PartitionProgress(0, 0, 50, 100, 50), PartitionProgress(1, 10, 30, 30, 20)), elapsed=2.0)
    lines(update)
    lines.finish(update)
    first, last = stream.getvalue().splitlines()
    assert first == last == "export  58.3% p0 50 (25/s) p1 20 (10/s) done"


def test_records_the_client_cannot_write_are_named() -> None:
    ok = StoredRecord(0, 0, 0, 0, b"k", b"v", (("h", b""),))
    assert unwritable(ok) is None
    assert unwritable(ok._replace(key=None)) is None
    assert "neither key nor value" in str(unwritable(ok._replace(key=None, value=None)))
    assert "null value" in str(unwritable(ok._replace(headers=(("h", None),))))


def test_an_import_refuses_an_unwritable_record_before_connecting(tmp_path: Path) -> None:
    from throughline.backup.exceptions import ImportRecordUnsupportedError
    from throughline.backup.files import SegmentWriter
    from throughline.backup.manifest import Manifest, PartitionEntry, save_manifest

    writer = SegmentWriter(tmp_path, "t", 0, 0)
    writer.write([StoredRecord(0, 0, 1, 0, b"k", b"v", ()), StoredRecord(0, 1, 1, 0, b"k", b"v", (("h", None),))])
    entry = writer.finish()
    assert entry is not None
    save_manifest(tmp_path, Manifest("t", "id", 1, {0: PartitionEntry(0, 2, 2, (entry,))}))
    with pytest.raises(ImportRecordUnsupportedError, match="p0@1"):
        import_backup("127.0.0.1:9", tmp_path, "new")
