"""A log backup's manifest (``manifest.json``): what the folder holds, and where an export resumes.

Pure apart from reading and writing the one file. The document (``FORMAT`` version ``VERSION``)::

    {"format": "throughline.log-backup", "version": 1, "recordSchema": "log_backup_record.v1",
     "codec": "deflate", "topic": "throughline.turns", "topicId": "<the topic's id>",
     "partitionCount": 3,
     "partitions": {"0": {"startOffset": 0, "nextOffset": 1200, "endOffset": 1200, "records": 1187,
                          "files": [{"name": "p0000/00000000000000000000.avro", "firstOffset": 0,
                                     "lastOffset": 1199, "records": 1187, "bytes": 81234,
                                     "sha256": "<hex>"}]}}}

Per partition: every committed record with ``startOffset <= offset < nextOffset`` is in the listed
files, in order, each exactly once; ``endOffset`` is the end offset the last export took at its start
(its upper bound), so the partition is complete when ``nextOffset >= endOffset``. ``nextOffset`` is
where the next export resumes. Offsets may have gaps (aborted transactions, control records); the
records keep their original offsets. Only partitions that were exported are listed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from throughline.backup.exceptions import BackupDamagedError, BackupTopicMismatchError
from throughline.backup.files import CODEC, SCHEMA_NAME, FileEntry, sha256_file
from throughline.durable import replace_file

FORMAT = "throughline.log-backup"
VERSION = 1
MANIFEST = "manifest.json"


@dataclass(frozen=True, slots=True)
class PartitionEntry:
    """One exported partition: its range and its files, in offset order."""

    start_offset: int
    next_offset: int
    end_offset: int
    files: tuple[FileEntry, ...] = ()

    @property
    def records(self) -> int:
        """Records in the files."""
        return sum(f.records for f in self.files)

    @property
    def complete(self) -> bool:
        """The last export reached the end offsets it took at its start."""
        return self.next_offset >= self.end_offset

    def with_file(self, entry: FileEntry) -> PartitionEntry:
        """This partition with one more file, which must start at or after ``next_offset``."""
        if entry.first_offset < self.next_offset or entry.last_offset < entry.first_offset:
            raise BackupDamagedError(
                f"{entry.name} holds offsets {entry.first_offset}..{entry.last_offset}, "
                f"but the backup already holds every record below {self.next_offset}"
            )
        return replace(self, files=(*self.files, entry), next_offset=entry.last_offset + 1)

    def to_json(self) -> dict[str, Any]:
        """The manifest's object for this partition."""
        return {
            "startOffset": self.start_offset,
            "nextOffset": self.next_offset,
            "endOffset": self.end_offset,
            "records": self.records,
            "files": [f.to_json() for f in self.files],
        }


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a backup folder holds."""

    topic: str
    topic_id: str | None
    partition_count: int
    partitions: dict[int, PartitionEntry] = field(default_factory=dict)

    def check_source(self, topic: str, topic_id: str | None, partition_count: int) -> None:
        """Refuse to extend this backup with another log's records (``BackupTopicMismatchError``)."""
        if (topic, topic_id, partition_count) != (self.topic, self.topic_id, self.partition_count):
            raise BackupTopicMismatchError(
                f"the folder holds a backup of topic {self.topic!r} (id {self.topic_id}, {self.partition_count} "
                f"partitions), not of {topic!r} (id {topic_id}, {partition_count} partitions): export into "
                "an empty folder"
            )

    def to_json(self) -> dict[str, Any]:
        """The manifest document."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "recordSchema": SCHEMA_NAME,
            "codec": CODEC,
            "topic": self.topic,
            "topicId": self.topic_id,
            "partitionCount": self.partition_count,
            "partitions": {str(p): e.to_json() for p, e in sorted(self.partitions.items())},
        }


def _file(doc: Any) -> FileEntry:
    return FileEntry(
        name=_text(doc["name"]),
        first_offset=_count(doc["firstOffset"]),
        last_offset=_count(doc["lastOffset"]),
        records=_count(doc["records"]),
        bytes=_count(doc["bytes"]),
        sha256=_text(doc["sha256"]),
    )


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a count")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{value!r} is not a name")
    return value


def parse_manifest(doc: Any) -> Manifest:
    """A manifest from its JSON document; ``BackupDamagedError`` when it is not one this version reads."""
    try:
        if doc.get("format") != FORMAT:
            raise ValueError(f"format {doc.get('format')!r} is not {FORMAT!r}")
        if doc.get("version") != VERSION or doc.get("recordSchema") != SCHEMA_NAME:
            raise ValueError(f"version {doc.get('version')!r} / schema {doc.get('recordSchema')!r} is not this one's")
        count = _count(doc["partitionCount"])
        partitions: dict[int, PartitionEntry] = {}
        for key, entry in doc["partitions"].items():
            p = int(key)
            if not 0 <= p < count:
                raise ValueError(f"partition {key} of a topic of {count}")
            files = tuple(_file(f) for f in entry["files"])
            partitions[p] = PartitionEntry(
                _count(entry["startOffset"]), _count(entry["nextOffset"]), _count(entry["endOffset"]), files
            )
            check_chain(p, partitions[p])
        topic_id = doc.get("topicId")
        return Manifest(_text(doc["topic"]), None if topic_id is None else _text(topic_id), count, partitions)
    except BackupDamagedError:
        raise
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise BackupDamagedError(f"the backup's {MANIFEST} is not a log backup manifest ({exc})") from None


def check_chain(partition: int, entry: PartitionEntry) -> None:
    """A partition's files follow each other in offset order, within ``startOffset .. nextOffset``."""
    below = entry.start_offset
    for f in entry.files:
        if f.first_offset < below or f.last_offset < f.first_offset or f.records < 1:
            raise BackupDamagedError(f"partition {partition}: {f.name} overlaps or precedes the file before it")
        if f.records > f.last_offset - f.first_offset + 1:
            raise BackupDamagedError(f"partition {partition}: {f.name} lists more records than its offsets hold")
        below = f.last_offset + 1
    if entry.next_offset < below:
        raise BackupDamagedError(f"partition {partition}: nextOffset {entry.next_offset} is inside its last file")


def load_manifest(root: Path) -> Manifest | None:
    """The folder's manifest (``None``: there is none yet, a new backup)."""
    path = root / MANIFEST
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise BackupDamagedError(f"{path} cannot be read ({exc})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BackupDamagedError(f"{path} is not JSON ({exc})") from None
    return parse_manifest(doc)


def save_manifest(root: Path, manifest: Manifest) -> None:
    """Write the manifest atomically and durably (a crash keeps the old one or the new one)."""
    text = json.dumps(manifest.to_json(), indent=2) + "\n"
    replace_file(root / MANIFEST, text.encode("utf-8"), mode=0o644)


def unlisted_files(root: Path, manifest: Manifest | None, partition: int) -> list[str]:
    """A partition's data files in the folder that the manifest does not list (left by a crash), in
    offset order."""
    folder = root / f"p{partition:04d}"
    if not folder.is_dir():
        return []
    listed = (
        {f.name for f in manifest.partitions[partition].files}
        if manifest and partition in manifest.partitions
        else set()
    )
    names = sorted(f"{folder.name}/{p.name}" for p in folder.glob("*.avro"))
    return [n for n in names if n not in listed]


def verify_files(root: Path, manifest: Manifest, partitions: list[int]) -> None:
    """Every file the manifest lists for ``partitions`` is there with its size and SHA-256, else
    ``BackupDamagedError`` naming the first that is not."""
    for p in partitions:
        for f in manifest.partitions[p].files:
            path = root / f.name
            if not path.is_file():
                raise BackupDamagedError(f"{path} is missing (listed in {MANIFEST})")
            size = path.stat().st_size
            if size != f.bytes:
                raise BackupDamagedError(f"{path} is {size} bytes, {MANIFEST} says {f.bytes}")
            digest = sha256_file(path)
            if digest != f.sha256:
                raise BackupDamagedError(f"{path}: SHA-256 {digest} differs from {MANIFEST}'s {f.sha256}")
