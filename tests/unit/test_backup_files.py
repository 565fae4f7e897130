"""Log backup data files: the record schema byte for byte, a torn last block found and cut off, and
records read back as they were written (``throughline.backup.files``; no broker)."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import fastavro
import pytest
from fastavro.schema import to_parsing_canonical_form

from throughline.backup.exceptions import BackupDamagedError
from throughline.backup.files import (
    PARSED_SCHEMA,
    SegmentWriter,
    file_name,
    read_file,
    salvage,
    scan,
    schema_text,
    to_avro,
)
from throughline.log.record_copy import LOG_APPEND_TIME, StoredRecord

#: The parsing canonical form of schemas/log_backup_record.v1.avsc, hashed: a change to the schema
#: (a field, a type, an order) changes it, and must come with a new version (v2), never an edit of v1.
SCHEMA_SHA256 = "6d6889686ebd42a00ca2305297e19d5bc35141ed2f1d7436b7fb89560632307c"


def _record(offset: int, partition: int = 0, size: int = 40) -> StoredRecord:
    return StoredRecord(
        partition, offset, 1_760_000_000_000 + offset, 0, b"k%d" % offset, bytes([offset % 251]) * size, ()
    )


def test_the_schema_is_version_1_as_published() -> None:
    canonical = to_parsing_canonical_form(fastavro.parse_schema(json.loads(schema_text())))
    assert hashlib.sha256(canonical.encode()).hexdigest() == SCHEMA_SHA256


@pytest.mark.parametrize(
    ("record", "golden"),
    [
        (
            StoredRecord(2, 300, 1_760_000_000_123, 0, b"\x01\x02", b"value", (("h", b"v"), ("n", None))),
            # partition 2, offset 300, timestamp, CREATE_TIME, key [1 2], value "value", headers h=v, n=null
            "04d804f681e682b9660002040102020a76616c7565040268020276026e0000",
        ),
        (StoredRecord(0, 0, 0, LOG_APPEND_TIME, None, None, ()), "00000002000000"),
    ],
)
def test_a_record_encodes_to_the_golden_bytes(record: StoredRecord, golden: str) -> None:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, PARSED_SCHEMA, to_avro(record))
    assert out.getvalue().hex() == golden


def test_files_are_named_in_offset_order() -> None:
    assert file_name(3, 12) == "p0003/00000000000000000012.avro"
    assert sorted([file_name(0, 1000), file_name(0, 20)]) == [file_name(0, 20), file_name(0, 1000)]


def _write(root: Path, records: list[StoredRecord], blocks_of: int = 10) -> Path:
    writer = SegmentWriter(root, "t", records[0].partition, records[0].offset)
    for i in range(0, len(records), blocks_of):
        writer.write(records[i : i + blocks_of])
        writer._writer.flush()  # one Avro block per slice, as a long export's blocks
    entry = writer.finish()
    assert entry is not None and entry.records == len(records)
    return writer.path


def test_records_read_back_byte_for_byte(tmp_path: Path) -> None:
    records = [_record(o) for o in (0, 1, 5, 6)] + [
        StoredRecord(0, 9, 7, LOG_APPEND_TIME, None, b"", (("a", b""), ("b", None)))
    ]
    path = _write(tmp_path, records)
    assert list(read_file(path)) == records
    # Any Avro reader reads it, and the header names what the file holds.
    with open(path, "rb") as f:
        reader = fastavro.reader(f)
        assert reader.metadata["throughline.backup.schema"] == "log_backup_record.v1"
        assert reader.metadata["throughline.backup.partition"] == "0"
        assert reader.metadata["avro.codec"] == "deflate"


def test_a_whole_file_scans_as_whole(tmp_path: Path) -> None:
    path = _write(tmp_path, [_record(o) for o in range(30)])
    found = scan(path.read_bytes())
    assert found.blocks == 3 and not found.torn and found.good_end == found.size


@pytest.mark.parametrize("cut", [1, 7, 20, 100])
def test_a_torn_last_block_is_found_and_cut_off(tmp_path: Path, cut: int) -> None:
    path = _write(tmp_path, [_record(o, size=200) for o in range(30)])
    whole = path.read_bytes()
    three = scan(whole)
    path.write_bytes(whole[:-cut])  # a crash in the middle of the last block's write
    found = scan(path.read_bytes())
    assert found.torn and found.blocks == 2 and found.good_end < three.good_end
    entry = salvage(tmp_path, file_name(0, 0))
    assert entry is not None
    assert (entry.first_offset, entry.last_offset, entry.records) == (0, 19, 20)
    assert path.stat().st_size == entry.bytes == found.good_end
    assert entry.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert [r.offset for r in read_file(path)] == list(range(20))


def test_zeros_after_the_last_block_are_a_torn_tail(tmp_path: Path) -> None:
    # A file system may show a crashed append as zeros up to the new size.
    path = _write(tmp_path, [_record(o) for o in range(20)])
    whole = path.read_bytes()
    path.write_bytes(whole + b"\x00" * 500)
    found = scan(path.read_bytes())
    assert found.torn and found.blocks == 2 and found.good_end == len(whole)


def test_a_file_cut_inside_its_header_holds_nothing(tmp_path: Path) -> None:
    path = _write(tmp_path, [_record(o) for o in range(5)])
    header_end = scan(path.read_bytes()).header_end
    path.write_bytes(path.read_bytes()[: header_end - 3])
    assert scan(path.read_bytes()).blocks == 0
    assert salvage(tmp_path, file_name(0, 0)) is None
    assert not path.exists()


def test_a_file_that_is_not_avro_is_damaged(tmp_path: Path) -> None:
    (tmp_path / "p0000").mkdir()
    (tmp_path / file_name(0, 0)).write_bytes(b"PAR1 not avro")
    with pytest.raises(BackupDamagedError):
        salvage(tmp_path, file_name(0, 0))


def test_a_file_with_a_corrupt_block_is_damaged_when_read(tmp_path: Path) -> None:
    path = _write(tmp_path, [_record(o, size=300) for o in range(10)], blocks_of=10)
    data = bytearray(path.read_bytes())
    found = scan(bytes(data))
    data[found.header_end + 10] ^= 0xFF  # inside the compressed block, its sync marker intact
    path.write_bytes(bytes(data))
    with pytest.raises(BackupDamagedError):
        list(read_file(path))
