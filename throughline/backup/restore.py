"""``import_backup``: write a log backup's records into a new topic, each partition in order.

Before anything is written, the manifest is read, every file it lists for the chosen partitions is
checked (size and SHA-256) and every record read once (in its place, and writable by the Kafka client
as it is: ``ImportRecordUnsupportedError`` otherwise): a damaged backup is refused whole (``BackupDamagedError``), so a restore
never writes half of a backup and then fails on a bad file. The topic is then created with the
backup's partition count (infinite retention, the replication throughline creates every topic with);
an existing topic that holds records is refused (``ImportTargetNotEmptyError``) unless the import is
resumed.

Records keep their key, value, headers and timestamp (as CreateTime) and go to the partition of the
same number, in the backup's order, through an idempotent producer (``throughline.log.record_copy``):
whatever stops a run, each partition of the new topic holds a prefix of the backup's partition. The
new topic's offsets are dense (0, 1, 2, ...): the original offsets, with their gaps, stay in the backup.

Resuming (``resume=True``): a partition holding N records continues at the backup's record N, after
checking that its record N-1 is the backup's (key, value, headers and timestamp); a partition with more
records than the backup, or another last record, is ``ImportTargetMismatchError``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from throughline.backup.exceptions import (
    BackupDamagedError,
    BackupIncompleteError,
    ImportRecordUnsupportedError,
    ImportTargetMismatchError,
    ImportTargetNotEmptyError,
)
from throughline.backup.files import read_file
from throughline.backup.manifest import MANIFEST, Manifest, load_manifest, verify_files
from throughline.backup.progress import CopyProgress, PartitionProgress
from throughline.errors import InvalidArgumentsError
from throughline.log import KafkaClientConfig, KafkaLog, bootstrap_list, describe_topic, ensure_topic
from throughline.log.exceptions import TopicMissingError
from throughline.log.record_copy import RecordSink, RecordSource, StoredRecord, unwritable

#: Records sent between two waits for their acknowledgements (a failure is seen this soon).
FLUSH_RECORDS = 20_000
#: How often the progress callback is called, at most (it is called once more at the end).
PROGRESS_SECONDS = 0.5


@dataclass(frozen=True, slots=True)
class ImportSummary:
    """What a run did: records written per partition (and skipped as already there), and how long."""

    topic: str
    source_topic: str
    written: dict[int, int]
    skipped: dict[int, int]
    created: bool
    complete: bool
    seconds: float

    def to_json(self) -> dict[str, Any]:
        """The summary the command prints."""
        total = sum(self.written.values())
        return {
            "topic": self.topic,
            "sourceTopic": self.source_topic,
            "created": self.created,
            "records": total,
            "recordsByPartition": {str(p): n for p, n in sorted(self.written.items())},
            "alreadyThere": {str(p): n for p, n in sorted(self.skipped.items()) if n},
            "complete": self.complete,
            "seconds": round(self.seconds, 3),
            "recordsPerSecond": round(total / self.seconds) if self.seconds > 0 else None,
        }


def backup_records(root: Path, manifest: Manifest, partition: int) -> Iterator[StoredRecord]:
    """A partition's records in the backup, in order (each file's records checked against the manifest)."""
    for f in manifest.partitions[partition].files:
        count = 0
        previous = -1
        for record in read_file(root / f.name):
            if record.partition != partition or not f.first_offset <= record.offset <= f.last_offset:
                raise BackupDamagedError(f"{f.name}: a record of p{record.partition}@{record.offset} is out of place")
            if record.offset <= previous:
                raise BackupDamagedError(f"{f.name}: offsets out of order at {record.offset}")
            previous = record.offset
            count += 1
            yield record
        if count != f.records:
            raise BackupDamagedError(f"{f.name} holds {count} records, {MANIFEST} says {f.records}")


def _check_records(root: Path, manifest: Manifest, chosen: list[int]) -> None:
    """Read every record once before anything is written: each in its place (``BackupDamagedError``)
    and writable as it is (``ImportRecordUnsupportedError``)."""
    for p in chosen:
        for record in backup_records(root, manifest, p):
            reason = unwritable(record)
            if reason is not None:
                raise ImportRecordUnsupportedError(
                    f"record p{p}@{record.offset} cannot be written as it is ({reason}); nothing was written"
                )


def _chosen(manifest: Manifest, wanted: Sequence[int] | None, allow_incomplete: bool) -> list[int]:
    held = sorted(manifest.partitions)
    chosen = held if wanted is None else sorted(set(wanted))
    missing = [p for p in chosen if p not in manifest.partitions]
    if missing:
        raise InvalidArgumentsError(f"the backup holds no partition {missing} (it holds {held})")
    incomplete = [p for p in chosen if not manifest.partitions[p].complete]
    if incomplete and not allow_incomplete:
        raise BackupIncompleteError(
            f"the export of partitions {incomplete} stopped before its end offsets: resume it with "
            "`throughline export`, or import what it holds with --allow-incomplete"
        )
    return chosen


def import_backup(
    bootstrap_servers: Sequence[str] | str,
    backup: str | Path,
    topic: str,
    *,
    partitions: Sequence[int] | None = None,
    resume: bool = False,
    allow_incomplete: bool = False,
    kafka_config: KafkaClientConfig | None = None,
    replication_factor: int | None = None,
    min_insync_replicas: int | None = None,
    progress: Callable[[CopyProgress], None] | None = None,
    stop: threading.Event | None = None,
    timeout: float = 15.0,
) -> ImportSummary:
    """Import the backup folder ``backup`` (``partitions`` of it; default all it holds) into the new
    topic ``topic``. Raises the errors the module docstring names, and the log's own."""
    started = time.monotonic()
    root = Path(backup)
    manifest = load_manifest(root)
    if manifest is None:
        raise BackupDamagedError(f"{root} holds no {MANIFEST}: it is not a log backup")
    chosen = _chosen(manifest, partitions, allow_incomplete)
    verify_files(root, manifest, chosen)  # before anything is written
    _check_records(root, manifest, chosen)
    servers = bootstrap_list(bootstrap_servers)
    created = _create_target(servers, topic, manifest, kafka_config, timeout, replication_factor, min_insync_replicas)
    with KafkaLog(servers, topic, timeout=timeout, kafka_config=kafka_config, client_id="throughline-import") as log:
        there = log.end_offsets()
    if not resume and any(there.values()):
        held = {p: n for p, n in there.items() if n}
        raise ImportTargetNotEmptyError(
            f"topic {topic!r} already holds records (end offsets {held}): an import writes a new topic "
            "(--resume continues an import into it)"
        )
    for p in chosen:
        _check_resumable(servers, topic, root, manifest, p, there[p], kafka_config, timeout)
    written = dict.fromkeys(chosen, 0)
    totals = {p: manifest.partitions[p].records for p in chosen}
    with RecordSink(servers, topic, kafka_config=kafka_config, connect_timeout=timeout) as sink:
        last = 0.0
        for p in chosen:
            skip = there[p]
            for record in backup_records(root, manifest, p):
                if skip:
                    skip -= 1
                    continue
                if stop is not None and stop.is_set():
                    break
                sink.send(p, record)
                written[p] += 1
                if written[p] % FLUSH_RECORDS == 0:
                    sink.flush()
                now = time.monotonic()
                if progress is not None and now - last >= PROGRESS_SECONDS:
                    last = now
                    progress(_snapshot(chosen, there, written, totals, now - started))
            sink.flush()
        if progress is not None:
            progress(_snapshot(chosen, there, written, totals, time.monotonic() - started))
    complete = all(there[p] + written[p] == totals[p] for p in chosen)
    return ImportSummary(
        topic, manifest.topic, written, {p: there[p] for p in chosen}, created, complete, time.monotonic() - started
    )


def _snapshot(
    chosen: list[int], there: dict[int, int], written: dict[int, int], totals: dict[int, int], elapsed: float
) -> CopyProgress:
    return CopyProgress(
        tuple(PartitionProgress(p, there[p], there[p] + written[p], totals[p], written[p]) for p in chosen), elapsed
    )


def _create_target(
    servers: list[str],
    topic: str,
    manifest: Manifest,
    kafka_config: KafkaClientConfig | None,
    timeout: float,
    replication_factor: int | None,
    min_insync_replicas: int | None,
) -> bool:
    """Create the topic with the backup's partition count (an existing one must have that count)."""
    try:
        existing = describe_topic(servers, topic, timeout=timeout, kafka_config=kafka_config)
    except TopicMissingError:
        existing = None
    if existing is not None and existing.partitions != manifest.partition_count:
        raise ImportTargetMismatchError(
            f"topic {topic!r} has {existing.partitions} partitions; the backup's topic had {manifest.partition_count}"
        )
    info = ensure_topic(
        servers,
        topic,
        partitions=manifest.partition_count,
        timeout=timeout,
        kafka_config=kafka_config,
        replication_factor=replication_factor,
        min_insync_replicas=min_insync_replicas,
    )
    return info.created


def _check_resumable(
    servers: list[str],
    topic: str,
    root: Path,
    manifest: Manifest,
    partition: int,
    there: int,
    kafka_config: KafkaClientConfig | None,
    timeout: float,
) -> None:
    """A partition that holds ``there`` records must hold the backup's first ``there`` (its last checked)."""
    if there == 0:
        return
    total = manifest.partitions[partition].records
    if there > total:
        raise ImportTargetMismatchError(
            f"partition {partition} of {topic!r} holds {there} records, the backup only {total}: not this backup's copy"
        )
    expected = next(r for i, r in enumerate(backup_records(root, manifest, partition)) if i == there - 1)
    found = _record_at(servers, topic, partition, there - 1, kafka_config, timeout)
    same = found is not None and (found.key, found.value, found.headers, found.timestamp) == (
        expected.key,
        expected.value,
        expected.headers,
        expected.timestamp,
    )
    if not same:
        raise ImportTargetMismatchError(
            f"record {there - 1} of partition {partition} of {topic!r} is not the backup's record "
            f"p{partition}@{expected.offset}: the topic is not a copy of this backup"
        )


def _record_at(
    servers: list[str], topic: str, partition: int, offset: int, kafka_config: KafkaClientConfig | None, timeout: float
) -> StoredRecord | None:
    """The record at ``offset`` of a partition (``None`` when none came within ``timeout``)."""
    source = RecordSource(servers, topic, [partition], timeout=timeout, kafka_config=kafka_config)
    try:
        source.seek(partition, offset)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for record in source.read(0.5, 10).get(partition, []):
                if record.offset == offset:
                    return record
    finally:
        source.close()
    return None
