"""``throughline repair``: append a source repair record, or (``--dry-run``) say what it would change.

The repair itself is an event on the log (``throughline.core.repair``): this command only builds the
record from the operator's names (project, and host and thread or the source hash that ``throughline
quarantine`` prints; the names are hashed here and never written) and appends it to the project's
partition through the producer path. What it does is decided by the projector when it applies the
record, from the projection's state at the record's position, so a replay decides the same.

``--dry-run`` appends nothing: it opens the projection read-only (``--db``) and applies
``decide_repair`` to the state it holds at its applied offset: whether the source is known and broken,
which quarantined records the repair would mark, and the chain length it would accept. Records the
projector applies between the dry run and the repair's own position can change the outcome; the
document says which applied offset it speaks for.
"""

from __future__ import annotations

from typing import Any

from throughline.core.partitioning import partition_for
from throughline.core.repair import RepairRecord, decide_repair
from throughline.core.turn import format_rfc3339
from throughline.projector.store import DuckProjection


def repair_json(repair: RepairRecord) -> dict[str, Any]:
    """The record as the command prints it (hashes and the operator's reason)."""
    return {
        "projectSha256": repair.project_sha256.hex(),
        "sourceSha256": repair.source_sha256.hex(),
        "reason": repair.reason,
        "requestedAt": format_rfc3339(repair.producer.produced_at_micros),
    }


def dry_run_document(db: str, topic: str, repair: RepairRecord) -> dict[str, Any]:
    """What applying ``repair`` now would change, read from the projection ``db`` (read-only)."""
    with DuckProjection.open(db, read_only=True, topic=topic) as projection:
        partitions = projection.partitions
        partition = None if partitions is None else partition_for(repair.project_sha256, partitions)
        with projection.view() as view:
            info = view.source(repair.source_sha256)
            applied = None if partition is None else view.applied_offset(partition)
        listing = projection.quarantine(repair.project_sha256, times=False)
    # A source hash of another project is not this project's source (the hash covers the project).
    source = info if info is not None and info.project_sha256 == repair.project_sha256 else None
    # The records a repair appended now would mark: the source's unmarked ones on the project's
    # partition (all of them are below the offset the repair will get).
    marks = [
        q
        for q in listing.records
        if q.source_sha256 == repair.source_sha256
        and q.repaired_by is None
        and (partition is None or q.partition == partition)
    ]
    outcome = decide_repair(
        known=source is not None, broken=source is not None and source.broken_reason is not None, unrepaired=len(marks)
    )
    return {
        "dryRun": True,
        "repair": {**repair_json(repair), "partition": partition},
        "projection": {
            "db": db,
            "appliedOffset": applied,
            "source": {
                "known": source is not None,
                "length": None if source is None else source.length,
                "broken": source is not None and source.broken_reason is not None,
                "reason": None if source is None else source.broken_reason,
            },
        },
        "wouldChange": {
            "outcome": outcome.status,
            "clearsBrokenMark": outcome.cleared,
            "marks": [{"partition": q.partition, "offset": q.offset, "code": q.code} for q in marks],
            "acceptedLength": 0 if source is None else source.length,
        },
    }
