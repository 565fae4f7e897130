"""Taking a projection snapshot into a directory (``take_cut``) and building a new projection file from
one (``load_cut_into``): the checks around the store's ``cut_files``.

A snapshot is loaded only into a file that does not exist yet, and only once it passed every check, in
this order: the manifest (format and schema version), each file's size and SHA-256, then the log it would
be caught up from (topic name, topic id, partition count; no partition's offset past the log's end
offset). Each refusal is its own error (``throughline.projector.exceptions``: ``projection_snapshot_*``).
The file is built as ``DB.snapshot-partial`` and renamed to ``DB`` when complete, so a crash leaves no
half-loaded projection under the real name. The projector then resumes every partition at the snapshot's
``next_offset`` (the offsets are in the file, as after any commit), and partitions the snapshot does not
include from 0.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from throughline.durable import sync_directory
from throughline.projector.cut_manifest import CutManifest, read_manifest, verify_files
from throughline.projector.exceptions import (
    SnapshotAheadOfLogError,
    SnapshotDamagedError,
    SnapshotLogMismatchError,
    SnapshotTargetError,
)
from throughline.projector.replay import remove_db_files, target_problem

if TYPE_CHECKING:
    from throughline.log import KafkaClientConfig
    from throughline.projector.store import DuckProjection

log = logging.getLogger(__name__)

PARTIAL_SUFFIX = ".snapshot-partial"


def take_cut(projection: DuckProjection, out_dir: Path, partitions: Sequence[int] | None = None) -> CutManifest:
    """Write a projection snapshot of ``partitions`` (``None``: every one) of ``projection`` into
    ``out_dir`` (created; an existing one must be empty: ``SnapshotTargetError``). On failure the files
    written so far are removed (a directory without ``manifest.json`` is never a snapshot anyway)."""
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise SnapshotTargetError(f"{out_dir} exists and is not an empty directory: a snapshot goes into a new one")
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        manifest: CutManifest = projection.export_cut(out_dir, partitions)
    except BaseException:
        for child in out_dir.iterdir():
            child.unlink(missing_ok=True)
        if created:
            out_dir.rmdir()
        raise
    sync_directory(out_dir)
    return manifest


def check_against_log(
    manifest: CutManifest, *, topic: str, topic_id: str | None, partition_count: int, ends: Mapping[int, int]
) -> None:
    """Refuse a snapshot of another log than ``topic`` as the broker describes it now.

    ``SnapshotLogMismatchError``: another topic name, topic id (both known and different: the topic was
    recreated, or this is another cluster) or partition count. ``SnapshotAheadOfLogError``: a partition's
    offset past the log's end offset ``ends[p]``."""
    if manifest.topic != topic:
        raise SnapshotLogMismatchError(f"a snapshot of topic {manifest.topic!r}, not {topic!r}")
    if manifest.topic_id is not None and topic_id is not None and manifest.topic_id != topic_id:
        raise SnapshotLogMismatchError(
            f"a snapshot of topic {topic!r} with id {manifest.topic_id}, but the topic now has id {topic_id}: "
            "it was deleted and recreated, or this is another cluster"
        )
    if manifest.partition_count != partition_count:
        raise SnapshotLogMismatchError(
            f"a snapshot of {manifest.partition_count} partitions; topic {topic!r} has {partition_count}"
        )
    ahead = {p: o for p, o in manifest.next_offsets().items() if o > ends.get(p, 0)}
    if ahead:
        raise SnapshotAheadOfLogError(
            "the snapshot applied records past the log's end: "
            + ", ".join(f"partition {p} at offset {o}, log ends at {ends.get(p, 0)}" for p, o in sorted(ahead.items()))
            + " (a stale or other cluster, or a truncated topic)"
        )


def verify_cut(cut_dir: Path) -> CutManifest:
    """The manifest of ``cut_dir`` once it parses and every file has its size and SHA-256."""
    manifest = read_manifest(cut_dir)
    verify_files(cut_dir, manifest)
    return manifest


def load_cut_into(
    cut_dir: Path,
    db: Path,
    *,
    bootstrap_servers: Sequence[str] | str,
    topic: str,
    kafka_config: KafkaClientConfig | None = None,
) -> CutManifest:
    """Build the new projection file ``db`` from the snapshot in ``cut_dir``, checked against the log of
    ``topic`` (see the module's docstring); returns its manifest. A projector on ``db`` then catches up
    from the snapshot's offsets."""
    from throughline.log import KafkaLog, describe_topic
    from throughline.projector.store.cut_files import load_cut

    problem = target_problem(db)
    if problem is not None:
        raise SnapshotTargetError(problem.replace("replay only writes", "a snapshot only loads into"))
    manifest = verify_cut(cut_dir)
    info = describe_topic(bootstrap_servers, topic, kafka_config=kafka_config)
    with KafkaLog(bootstrap_servers, topic, kafka_config=kafka_config) as view:
        ends = view.end_offsets()
    check_against_log(manifest, topic=topic, topic_id=info.topic_id, partition_count=info.partitions, ends=ends)
    partial = db.with_name(db.name + PARTIAL_SUFFIX)
    remove_db_files(partial)
    done = False
    try:
        try:
            load_cut(partial, cut_dir, manifest)
        except OSError as exc:
            raise SnapshotDamagedError(f"cannot build {partial} from the snapshot: {exc}") from None
        problem = target_problem(db)  # someone may have created it meanwhile
        if problem is not None:
            raise SnapshotTargetError(problem)
        os.replace(partial, db)
        sync_directory(db.parent)
        done = True
    finally:
        if not done:
            remove_db_files(partial)
    log.info("loaded projection snapshot of %s partitions %s into %s", topic, list(manifest.partitions), db)
    return manifest


def remove_tree(path: Path) -> None:
    """Remove a downloaded snapshot directory (best effort: a leftover is only disk)."""
    shutil.rmtree(path, ignore_errors=True)
