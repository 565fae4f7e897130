"""A log backup's data files: Avro object container files of ``LogBackupRecord`` (one partition each).

The record schema is ``schemas/log_backup_record.v1.avsc`` (``SCHEMA_NAME``); every file also names it,
the topic and the partition in its header metadata (``throughline.backup.*`` keys), so a file read on
its own says what it holds. Any Avro library reads the files: the codec is ``deflate``, which every
Avro implementation has (fastavro reads and writes ``zstandard`` only with a library this project does
not depend on).

A file is written block by block (an Avro block is a count, a size, the records and the file's 16-byte
sync marker). A crash leaves at most a torn last block: ``scan`` finds where the last complete block
ends (each block's size fits in the file and its sync marker matches the header's) and ``salvage``
truncates the file there, so an export resumes after the last record that is whole on disk.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, BinaryIO

import fastavro

from throughline.backup.exceptions import BackupDamagedError
from throughline.core.encoding import read_zigzag
from throughline.durable import sync_directory
from throughline.log.record_copy import StoredRecord

#: The backup record schema's family and version (the ``.avsc`` file's name without its suffix).
SCHEMA_NAME = "log_backup_record.v1"
#: The Avro codec of the data files (Avro's own name), and its level: deflate's fastest, which keeps
#: transcript-shaped records in ~0.35x their bytes at ~17k records/s on one core, where level 6 keeps
#: ~0.30x at ~3k records/s (measured with fastavro 1.13 on the 2-core machine; snappy: ~0.43x at ~27k/s).
CODEC = "deflate"
CODEC_LEVEL = 1
#: Uncompressed bytes of records per Avro block: a crash loses at most one block's records on disk,
#: which the next run exports again.
BLOCK_BYTES = 1024 * 1024
MAGIC = b"Obj\x01"
SYNC_SIZE = 16
_TIMESTAMP_TYPES = ("CREATE_TIME", "LOG_APPEND_TIME")
#: Header metadata keys (besides Avro's own ``avro.schema`` and ``avro.codec``).
META_SCHEMA = "throughline.backup.schema"
META_TOPIC = "throughline.backup.topic"
META_PARTITION = "throughline.backup.partition"


def schema_text() -> str:
    """The backup record schema as shipped (``schemas/log_backup_record.v1.avsc``)."""
    return resources.files("throughline.schemas").joinpath(f"{SCHEMA_NAME}.avsc").read_text("utf-8")


PARSED_SCHEMA: Any = fastavro.parse_schema(json.loads(schema_text()))


def to_avro(record: StoredRecord) -> dict[str, Any]:
    """A stored record as a ``LogBackupRecord`` datum."""
    return {
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "timestampType": _TIMESTAMP_TYPES[record.timestamp_type],
        "key": record.key,
        "value": record.value,
        "headers": [{"key": k, "value": v} for k, v in record.headers],
    }


def from_avro(datum: dict[str, Any]) -> StoredRecord:
    """A ``LogBackupRecord`` datum as a stored record."""
    return StoredRecord(
        datum["partition"],
        datum["offset"],
        datum["timestamp"],
        _TIMESTAMP_TYPES.index(datum["timestampType"]),
        datum["key"],
        datum["value"],
        tuple((h["key"], h["value"]) for h in datum["headers"]),
    )


@dataclass(frozen=True, slots=True)
class FileEntry:
    """A finished data file as the manifest lists it (``name`` relative to the backup folder)."""

    name: str
    first_offset: int
    last_offset: int
    records: int
    bytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        """The manifest's object for this file."""
        return {
            "name": self.name,
            "firstOffset": self.first_offset,
            "lastOffset": self.last_offset,
            "records": self.records,
            "bytes": self.bytes,
            "sha256": self.sha256,
        }


def file_name(partition: int, first_offset: int) -> str:
    """Where a partition's file that starts at ``first_offset`` lives, relative to the backup folder
    (names sort in offset order)."""
    return f"p{partition:04d}/{first_offset:020d}.avro"


def sha256_file(path: Path) -> str:
    """The hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class SegmentWriter:
    """Writes one data file of a partition; ``finish`` closes it durably and returns its ``FileEntry``."""

    def __init__(self, root: Path, topic: str, partition: int, first_offset: int) -> None:
        self.name = file_name(partition, first_offset)
        self.path = root / self.name
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: BinaryIO = open(self.path, "wb")
        self._writer = fastavro.write.Writer(
            self._file,
            PARSED_SCHEMA,
            codec=CODEC,
            compression_level=CODEC_LEVEL,
            sync_interval=BLOCK_BYTES,
            metadata={META_SCHEMA: SCHEMA_NAME, META_TOPIC: topic, META_PARTITION: str(partition)},
        )
        self.first_offset: int | None = None
        self.last_offset: int | None = None
        self.records = 0

    def write(self, records: Iterable[StoredRecord]) -> None:
        """Append records (in offset order)."""
        for record in records:
            self._writer.write(to_avro(record))
            if self.first_offset is None:
                self.first_offset = record.offset
            self.last_offset = record.offset
            self.records += 1

    @property
    def size(self) -> int:
        """Bytes written to the file so far (whole blocks)."""
        return self._file.tell()

    def finish(self) -> FileEntry | None:
        """Write the last block, fsync and close; ``None`` (and no file) when no record was written."""
        self._writer.flush()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        if self.first_offset is None or self.last_offset is None:
            self.path.unlink()
            return None
        sync_directory(self.path.parent)
        return FileEntry(
            self.name,
            self.first_offset,
            self.last_offset,
            self.records,
            self.path.stat().st_size,
            sha256_file(self.path),
        )


@dataclass(frozen=True, slots=True)
class ContainerScan:
    """Where an Avro container file's header ends and its last complete block ends (``good_end``)."""

    header_end: int  # 0: the header itself is incomplete
    good_end: int
    blocks: int
    size: int

    @property
    def torn(self) -> bool:
        """Bytes follow the last complete block (a write that a crash cut short)."""
        return self.good_end < self.size


def _skip_metadata(data: bytes, pos: int) -> int:
    """The position after the header's metadata map (Avro map of bytes, in blocks)."""
    while True:
        count, pos = read_zigzag(data, pos)
        if count == 0:
            return pos
        if count < 0:
            count = -count
            _, pos = read_zigzag(data, pos)  # the block's size in bytes
        for _ in range(count):
            for _field in range(2):  # key string, value bytes
                length, pos = read_zigzag(data, pos)
                if length < 0:
                    raise ValueError("negative length in the header")
                pos += length
                if pos > len(data):
                    raise IndexError("the header ends early")


def scan(data: bytes) -> ContainerScan:
    """Find the last complete block of an Avro object container file's bytes (pure).

    Raises ``ValueError`` when the bytes are not an Avro container file at all (another magic).
    """
    size = len(data)
    if data[: len(MAGIC)] != MAGIC[: min(size, len(MAGIC))]:
        raise ValueError("not an Avro object container file")
    try:
        pos = _skip_metadata(data, len(MAGIC))
    except (IndexError, ValueError):
        return ContainerScan(0, 0, 0, size)
    if pos + SYNC_SIZE > size:
        return ContainerScan(0, 0, 0, size)
    sync = data[pos : pos + SYNC_SIZE]
    header_end = good_end = pos + SYNC_SIZE
    blocks = 0
    pos = header_end
    while pos < size:
        try:
            count, p = read_zigzag(data, pos)
            length, p = read_zigzag(data, p)
        except (IndexError, ValueError):
            break
        end = p + length + SYNC_SIZE
        if count < 1 or length < 0 or end > size or data[end - SYNC_SIZE : end] != sync:
            break
        blocks += 1
        pos = good_end = end
    return ContainerScan(header_end, good_end, blocks, size)


def read_file(path: Path, *, data: bytes | None = None) -> Iterator[StoredRecord]:
    """The records of a data file, in order (``data``: its bytes, when already read)."""
    source = io.BytesIO(path.read_bytes() if data is None else data)
    try:
        for datum in fastavro.reader(source, reader_schema=PARSED_SCHEMA):
            yield from_avro(datum)  # type: ignore[arg-type]
    except (ValueError, EOFError, OSError, KeyError, TypeError, IndexError, zlib.error) as exc:
        raise BackupDamagedError(f"{path}: cannot be read as a log backup file ({exc})") from None


def salvage(root: Path, name: str) -> FileEntry | None:
    """Make a file a crash left (not listed in the manifest) whole: truncate a torn tail to its last
    complete block and return its entry; ``None`` (the file removed) when no complete block is left."""
    path = root / name
    data = path.read_bytes()
    try:
        found = scan(data)
    except ValueError as exc:
        raise BackupDamagedError(f"{path}: {exc}") from None
    if found.blocks == 0:
        path.unlink()
        return None
    if found.torn:
        with open(path, "r+b") as f:
            f.truncate(found.good_end)
            f.flush()
            os.fsync(f.fileno())
        data = data[: found.good_end]
    first = last = -1
    count = 0
    for record in read_file(path, data=data):
        first = record.offset if count == 0 else first
        last, count = record.offset, count + 1
    return FileEntry(name, first, last, count, len(data), hashlib.sha256(data).hexdigest())
