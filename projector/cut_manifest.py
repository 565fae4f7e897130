"""The manifest of a projection snapshot (docs/operations.md "Projection snapshots"): what a snapshot
directory holds and how a loader checks it before trusting a byte of it.

A projection snapshot is a directory of one Parquet file per table (``<table>.parquet``, written by
``throughline.projector.store.cut_files``) and ``manifest.json``: the format version, the projection
schema version, the topic, its id and partition count, the partitions included, each included partition's
``applied_offsets`` row as committed with the rows (``next_offset`` and the counters), and each file's row
count, size and SHA-256. Named "cut" in code (a consistent cut of the projection), never "snapshot",
which is a read's snapshot inside the store (``projector/store/snapshots.py``).

Nothing here imports DuckDB: the manifest and the files' digests are checked before any file is read.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from throughline.projector.exceptions import SnapshotDamagedError, SnapshotPartitionsError, SnapshotVersionError

#: The format this throughline writes and the only one it loads (a new layout gets a new version).
FORMAT = "throughline.projection_snapshot.v1"
MANIFEST = "manifest.json"
#: The tables a snapshot holds, in load order. ``meta`` is not among them: its rows (topic, topic id,
#: partition count, schema version) are the manifest's own fields.
CUT_TABLES = (
    "applied_offsets",
    "sources",
    "project_heads",
    "turns",
    "superseded_turns",
    "turn_ids",
    "quarantine",
    "repairs",
)
#: The counters of an ``applied_offsets`` row, in the table's column order after the partition.
COUNTERS = ("next_offset", "records", "appended", "rewinds", "duplicates", "quarantined")
_READ_CHUNK = 1 << 20
_MAX_MANIFEST_BYTES = 1 << 20


def table_file(table: str) -> str:
    """The file name of ``table`` in a snapshot directory."""
    return f"{table}.parquet"


@dataclass(frozen=True, slots=True)
class TableFile:
    """One table's file: its name, row count, size in bytes and SHA-256 (hex)."""

    table: str
    file: str
    rows: int
    bytes: int
    sha256: str


@dataclass(frozen=True, slots=True)
class CutManifest:
    """Everything ``manifest.json`` says (see the module's docstring)."""

    schema_version: str
    topic: str
    topic_id: str | None
    partition_count: int
    partitions: tuple[int, ...]
    #: partition -> its ``applied_offsets`` counters (``COUNTERS``), for the included partitions the
    #: projection had applied; an included partition absent here had applied nothing (offset 0).
    offsets: Mapping[int, Mapping[str, int]]
    tables: Mapping[str, TableFile]
    format: str = FORMAT

    def next_offsets(self) -> dict[int, int]:
        """The offset the projector resumes at, per included partition (0 for one never applied)."""
        return {p: int(self.offsets[p]["next_offset"]) if p in self.offsets else 0 for p in self.partitions}

    def to_json(self) -> dict[str, Any]:
        """The manifest document (keys in a fixed order: two cuts of one state have equal manifests)."""
        return {
            "format": self.format,
            "schemaVersion": self.schema_version,
            "topic": self.topic,
            "topicId": self.topic_id,
            "partitionCount": self.partition_count,
            "partitions": list(self.partitions),
            "offsets": {str(p): {name: int(self.offsets[p][name]) for name in COUNTERS} for p in sorted(self.offsets)},
            "tables": {
                t.table: {"file": t.file, "rows": t.rows, "bytes": t.bytes, "sha256": t.sha256}
                for t in (self.tables[name] for name in CUT_TABLES if name in self.tables)
            },
        }

    def dumps(self) -> str:
        """The manifest as the text of ``manifest.json``."""
        return json.dumps(self.to_json(), indent=2, ensure_ascii=True) + "\n"


def file_sha256(path: Path) -> str:
    """SHA-256 (hex) of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def describe_file(table: str, directory: Path, rows: int) -> TableFile:
    """The ``TableFile`` of a table file just written to ``directory``."""
    path = directory / table_file(table)
    return TableFile(table, path.name, rows, path.stat().st_size, file_sha256(path))


def write_manifest(directory: Path, manifest: CutManifest) -> None:
    """Write ``manifest.json`` last, synced: a directory with a manifest is a finished snapshot."""
    path = directory / MANIFEST
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, manifest.dumps().encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)


def parse_partitions(text: str | Sequence[int] | None) -> tuple[int, ...] | None:
    """``--partitions 0,2,5`` (or a list of ints) as sorted distinct partitions; ``None``: every one.

    ``SnapshotPartitionsError`` for anything else than non-negative integers."""
    if text is None:
        return None
    items: Iterable[object] = text.replace(" ", ",").split(",") if isinstance(text, str) else text
    out: set[int] = set()
    for item in items:
        if isinstance(item, str):
            if not item:
                continue
            if not item.isdigit() or len(item) > 9:
                raise SnapshotPartitionsError(f"--partitions takes partition numbers such as 0,2,5, not {item!r}")
            item = int(item)
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise SnapshotPartitionsError(f"a partition is a non-negative integer, not {item!r}")
        out.add(item)
    if not out:
        raise SnapshotPartitionsError("--partitions names no partition")
    return tuple(sorted(out))


def _field(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = doc.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise SnapshotDamagedError(f"the snapshot manifest's {key!r} is missing or not a {kind}")
    return value


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SnapshotDamagedError(f"the snapshot manifest's {what} is not a non-negative integer")
    return value


def manifest_from_json(doc: object) -> CutManifest:
    """Parse a manifest document; ``SnapshotVersionError`` for another format version or schema version
    than this throughline's, ``SnapshotDamagedError`` for any other shape."""
    from throughline.projector.store.schema import SCHEMA_VERSION

    if not isinstance(doc, dict):
        raise SnapshotDamagedError("the snapshot manifest is not a JSON object")
    fmt = doc.get("format")
    if fmt != FORMAT:
        raise SnapshotVersionError(f"a snapshot of format {fmt!r}; this throughline loads {FORMAT!r} only")
    schema = doc.get("schemaVersion")
    if schema != SCHEMA_VERSION:
        raise SnapshotVersionError(
            f"a snapshot of projection schema version {schema!r}; this throughline writes version "
            f"{SCHEMA_VERSION}: catch up from the log instead (or take the snapshot with a matching version)"
        )
    topic = _field(doc, "topic", str)
    topic_id = doc.get("topicId")
    if topic_id is not None and not isinstance(topic_id, str):
        raise SnapshotDamagedError("the snapshot manifest's 'topicId' is not a string")
    count = _count(doc.get("partitionCount"), "partitionCount")
    partitions = tuple(_count(p, "partition") for p in _field(doc, "partitions", list))
    if count < 1 or list(partitions) != sorted(set(partitions)) or any(p >= count for p in partitions):
        raise SnapshotDamagedError("the snapshot manifest's partitions are not distinct, sorted and in the topic")
    offsets: dict[int, dict[str, int]] = {}
    for key, row in _field(doc, "offsets", dict).items():
        if not key.isdigit() or int(key) not in partitions or not isinstance(row, dict):
            raise SnapshotDamagedError(f"the snapshot manifest's offsets name partition {key!r}, not included")
        offsets[int(key)] = {name: _count(row.get(name), f"offsets[{key}].{name}") for name in COUNTERS}
    tables: dict[str, TableFile] = {}
    listed = _field(doc, "tables", dict)
    if set(listed) != set(CUT_TABLES):
        raise SnapshotDamagedError(f"the snapshot manifest lists tables {sorted(listed)}, not {sorted(CUT_TABLES)}")
    for name in CUT_TABLES:
        entry = listed[name]
        if not isinstance(entry, dict) or entry.get("file") != table_file(name):
            raise SnapshotDamagedError(f"the snapshot manifest's entry of table {name!r} is not {table_file(name)!r}")
        digest = entry.get("sha256")
        if not isinstance(digest, str) or len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
            raise SnapshotDamagedError(f"the snapshot manifest's sha256 of table {name!r} is not a SHA-256")
        tables[name] = TableFile(
            name,
            table_file(name),
            _count(entry.get("rows"), f"{name}.rows"),
            _count(entry.get("bytes"), "bytes"),
            digest,
        )
    return CutManifest(
        schema_version=schema,
        topic=topic,
        topic_id=topic_id,
        partition_count=count,
        partitions=partitions,
        offsets=offsets,
        tables=tables,
    )


def read_manifest(directory: Path) -> CutManifest:
    """Read and parse ``directory/manifest.json`` (``SnapshotDamagedError`` when it is missing or broken)."""
    path = directory / MANIFEST
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise SnapshotDamagedError(f"no readable snapshot manifest at {path}: {exc.strerror or exc}") from None
    if len(raw) > _MAX_MANIFEST_BYTES:
        raise SnapshotDamagedError(f"{path} is larger than {_MAX_MANIFEST_BYTES} bytes: not a snapshot manifest")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SnapshotDamagedError(f"{path} is not JSON: {exc}") from None
    return manifest_from_json(doc)


def verify_files(directory: Path, manifest: CutManifest) -> None:
    """Every file the manifest names is in ``directory`` with its size and SHA-256
    (``SnapshotDamagedError`` naming the first that is not)."""
    for name in CUT_TABLES:
        entry = manifest.tables[name]
        path = directory / entry.file
        try:
            size = path.stat().st_size
        except OSError:
            raise SnapshotDamagedError(f"the snapshot has no file {entry.file} (table {name})") from None
        if size != entry.bytes:
            raise SnapshotDamagedError(
                f"the snapshot's {entry.file} has {size} bytes, the manifest says {entry.bytes}: a partial copy?"
            )
        digest = file_sha256(path)
        if digest != entry.sha256:
            raise SnapshotDamagedError(
                f"the snapshot's {entry.file} has SHA-256 {digest}, the manifest says {entry.sha256}: damaged"
            )
