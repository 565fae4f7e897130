"""``export_log``: write a topic's committed records into a backup folder, resumably.

A run takes every chosen partition's end offset at its start (one request, the last stable offsets)
and copies each partition from where the folder's backup ends up to that bound, then stops: records
appended meanwhile wait for the next run. Records are read ``read_committed`` (aborted transactional
records and control records are not exported) and written byte for byte with their original offsets,
timestamps and headers (``throughline.backup.files``).

Resuming: the manifest says where each partition's backup ends (``nextOffset``). A file the manifest
does not list was being written when a run stopped (a crash, a kill): it is cut back to its last
complete Avro block and listed (``salvage``), and the partition resumes after its last record. The
manifest is rewritten (atomically) whenever a file is finished, so a crash loses at most the torn
block, which the next run reads again: no record twice, none missing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from throughline.backup.exceptions import (
    BackupFolderError,
    BackupLogGapError,
    BackupTopicMismatchError,
    ExportStalledError,
)
from throughline.backup.files import SegmentWriter, salvage
from throughline.backup.manifest import (
    Manifest,
    PartitionEntry,
    load_manifest,
    save_manifest,
    unlisted_files,
)
from throughline.backup.progress import CopyProgress, PartitionProgress
from throughline.errors import InvalidArgumentsError
from throughline.log import KafkaClientConfig, KafkaLog, bootstrap_list, describe_topic
from throughline.log.record_copy import RecordSource

#: A data file is finished (and listed) once it holds this many bytes; the next records go to a new one.
FILE_BYTES = 256 * 1024 * 1024
#: An export that reads nothing for this long before its bound gives up (``ExportStalledError``).
STALL_TIMEOUT = 120.0
POLL_SECONDS = 0.5
POLL_RECORDS = 5000


@dataclass(frozen=True, slots=True)
class ExportSummary:
    """What a run did: the topic, the bounds it stopped at, records and files written, and the manifest."""

    topic: str
    topic_id: str | None
    end_offsets: dict[int, int]
    records: dict[int, int]
    files_written: int
    salvaged: tuple[str, ...]
    complete: bool
    seconds: float
    manifest: Manifest

    def to_json(self) -> dict[str, Any]:
        """The summary the command prints."""
        total = sum(self.records.values())
        return {
            "topic": self.topic,
            "topicId": self.topic_id,
            "endOffsets": {str(p): e for p, e in sorted(self.end_offsets.items())},
            "records": total,
            "recordsByPartition": {str(p): n for p, n in sorted(self.records.items())},
            "filesWritten": self.files_written,
            "salvaged": list(self.salvaged),
            "complete": self.complete,
            "seconds": round(self.seconds, 3),
            "recordsPerSecond": round(total / self.seconds) if self.seconds > 0 else None,
        }


def chosen_partitions(wanted: Sequence[int] | None, count: int, topic: str) -> list[int]:
    """The partitions to work on: ``wanted`` (each one of the topic's), else all of them."""
    if wanted is None:
        return list(range(count))
    for p in wanted:
        if not 0 <= p < count:
            raise InvalidArgumentsError(f"partition {p} is not one of topic {topic!r}'s {count} partitions")
    return sorted(set(wanted))


def _prepare_folder(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise BackupFolderError(f"{out} is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BackupFolderError(f"{out} cannot be created ({exc.strerror})") from None


def _resume_points(
    out: Path, manifest: Manifest, chosen: list[int], begins: dict[int, int], ends: dict[int, int]
) -> tuple[Manifest, list[str]]:
    """The manifest with every chosen partition's files a crash left salvaged and its new bound; the
    names salvaged."""
    partitions = dict(manifest.partitions)
    salvaged: list[str] = []
    for p in chosen:
        entry = partitions.get(p) or PartitionEntry(begins[p], begins[p], ends[p])
        for name in unlisted_files(out, manifest, p):
            found = salvage(out, name)
            if found is not None:
                entry = entry.with_file(found)
                salvaged.append(name)
        if entry.next_offset < begins[p]:
            raise BackupLogGapError(
                f"partition {p}: the backup ends at offset {entry.next_offset} but the log now begins at "
                f"{begins[p]} (records deleted meanwhile): export into an empty folder"
            )
        if entry.next_offset > ends[p]:
            raise BackupTopicMismatchError(
                f"partition {p}: the backup holds records up to offset {entry.next_offset} but the log ends at "
                f"{ends[p]}: it is another log (a topic recreated?); export into an empty folder"
            )
        partitions[p] = replace(entry, end_offset=ends[p])
    return replace(manifest, partitions=partitions), salvaged


def export_log(
    bootstrap_servers: Sequence[str] | str,
    topic: str,
    out: str | Path,
    *,
    partitions: Sequence[int] | None = None,
    kafka_config: KafkaClientConfig | None = None,
    progress: Callable[[CopyProgress], None] | None = None,
    stop: threading.Event | None = None,
    timeout: float = 15.0,
    file_bytes: int = FILE_BYTES,
    stall_timeout: float = STALL_TIMEOUT,
) -> ExportSummary:
    """Export ``partitions`` (default: all) of ``topic`` into the folder ``out``, resuming the backup
    already there; stop at the end offsets taken at the start (or when ``stop`` is set: what was
    written is kept and listed, and the summary says ``complete: false``).

    Raises ``BackupTopicMismatchError`` when the folder holds another log's backup,
    ``BackupLogGapError`` when the log no longer holds where the backup ends, ``BackupDamagedError``
    for a manifest or a leftover file that is not a backup's, ``ExportStalledError`` when nothing
    arrives for ``stall_timeout`` seconds, and the log's own errors.
    """
    servers = bootstrap_list(bootstrap_servers)
    root = Path(out)
    _prepare_folder(root)
    started = time.monotonic()
    info = describe_topic(servers, topic, timeout=timeout, kafka_config=kafka_config)
    chosen = chosen_partitions(partitions, info.partitions, topic)
    manifest = load_manifest(root) or Manifest(topic, info.topic_id, info.partitions)
    manifest.check_source(topic, info.topic_id, info.partitions)
    with KafkaLog(servers, topic, timeout=timeout, kafka_config=kafka_config, client_id="throughline-export") as log:
        begins = log.beginning_offsets(chosen)
        ends = log.end_offsets(chosen)  # one request: the consistent upper bound of this run
    manifest, salvaged = _resume_points(root, manifest, chosen, begins, ends)
    save_manifest(root, manifest)
    run = _ExportRun(root, topic, manifest, chosen, file_bytes)
    try:
        if run.active:
            source = RecordSource(servers, topic, run.active, timeout=timeout, kafka_config=kafka_config)
            try:
                run.copy(source, stall_timeout, progress, stop, started)
            finally:
                source.close()
    finally:
        run.close()
    return ExportSummary(
        topic=topic,
        topic_id=info.topic_id,
        end_offsets=ends,
        records=dict(run.written),
        files_written=run.files,
        salvaged=tuple(salvaged),
        complete=all(run.manifest.partitions[p].complete for p in chosen),
        seconds=time.monotonic() - started,
        manifest=run.manifest,
    )


class _ExportRun:
    """One run's state: the manifest as it grows, the open file of each partition, the counts."""

    def __init__(self, root: Path, topic: str, manifest: Manifest, chosen: list[int], file_bytes: int) -> None:
        self.root = root
        self.topic = topic
        self.manifest = manifest
        self.file_bytes = file_bytes
        self.start = {p: manifest.partitions[p].next_offset for p in chosen}
        self.position = dict(self.start)
        self.end = {p: manifest.partitions[p].end_offset for p in chosen}
        self.written = dict.fromkeys(chosen, 0)
        self.writers: dict[int, SegmentWriter] = {}
        self.files = 0

    @property
    def active(self) -> list[int]:
        """The partitions below their bound."""
        return [p for p in self.position if self.position[p] < self.end[p]]

    def copy(
        self,
        source: RecordSource,
        stall_timeout: float,
        progress: Callable[[CopyProgress], None] | None,
        stop: threading.Event | None,
        started: float,
    ) -> None:
        """Copy every active partition from ``source`` (assigned those partitions) up to its bound."""
        active = self.active
        for p in active:
            source.seek(p, self.position[p])
        last_read = time.monotonic()
        while active and not (stop is not None and stop.is_set()):
            polled = source.read(POLL_SECONDS, POLL_RECORDS)
            for p, records in polled.items():
                self._write(p, [r for r in records if r.offset < self.end[p]])
            moved = False
            for p in list(active):
                at = max(self.position[p], min(source.position(p), self.end[p]))
                moved = moved or at != self.position[p]
                self.position[p] = at
                if at >= self.end[p]:
                    self._finish(p, complete=True)
                    source.pause(p)
                    active.remove(p)
            now = time.monotonic()
            if moved or polled:
                last_read = now
            elif now - last_read > stall_timeout:
                raise ExportStalledError(
                    f"nothing read for {stall_timeout:g}s on partitions {active} before their end offsets; "
                    "what was written is kept: run the export again to resume"
                )
            if progress is not None:
                progress(self.snapshot(now - started))

    def snapshot(self, elapsed: float) -> CopyProgress:
        """The progress of every partition now."""
        return CopyProgress(
            tuple(
                PartitionProgress(p, self.start[p], self.position[p], self.end[p], self.written[p])
                for p in sorted(self.position)
            ),
            elapsed,
        )

    def _write(self, partition: int, records: list[Any]) -> None:
        if not records:
            return
        writer = self.writers.get(partition)
        if writer is None:
            writer = self.writers[partition] = SegmentWriter(self.root, self.topic, partition, records[0].offset)
        writer.write(records)
        self.written[partition] += len(records)
        self.position[partition] = max(self.position[partition], records[-1].offset + 1)
        if writer.size >= self.file_bytes:
            self._finish(partition, complete=False)

    def _finish(self, partition: int, *, complete: bool) -> None:
        """Close the partition's open file (if any), list it, and (``complete``) mark the partition done."""
        entry = self.manifest.partitions[partition]
        writer = self.writers.pop(partition, None)
        if writer is not None:
            finished = writer.finish()
            if finished is not None:
                entry = entry.with_file(finished)
                self.files += 1
        if complete:
            entry = replace(entry, next_offset=max(entry.next_offset, entry.end_offset))
        self.manifest = replace(self.manifest, partitions={**self.manifest.partitions, partition: entry})
        save_manifest(self.root, self.manifest)

    def close(self) -> None:
        """Finish every open file (a stop, a failure): what was written is listed, and resumable."""
        for p in list(self.writers):
            self._finish(p, complete=False)
