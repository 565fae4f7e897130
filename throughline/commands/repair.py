"""``throughline repair --project P (--host H --thread T | --source SHA256) --reason TEXT [--dry-run]``: append a source repair record, or (``--dry-run``) say what it would change.

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

import argparse
import json
import sys
import time
from typing import Any

from throughline.commands.options import command, settings_from
from throughline.core.exceptions import RepairArgumentsError
from throughline.core.partitioning import partition_for
from throughline.core.repair import RepairRecord, build_repair, decide_repair, parse_source_hash
from throughline.core.turn import format_rfc3339

#: The producer name a repair record carries (``producer.name``).
REPAIR_PRODUCER_NAME = "throughline-repair"


def register(subparsers: Any) -> None:
    """Add ``repair`` to the ``throughline`` parser."""
    repair = command(
        subparsers,
        "repair",
        _cmd_repair,
        help="append a repair record that un-breaks a source (see docs/operations.md)",
        description="Append a source repair record to the project's partition: when the projector applies "
        "it, the source's chain as applied is accepted and served again, and its quarantined records are "
        "marked repaired. --dry-run reads --db and prints what would change, appending nothing.",
    )
    repair.add_argument("--project", required=True, metavar="P", help="the project (its name; it is hashed)")
    repair.add_argument("--host", default=None, metavar="H", help="the source's host (with --thread; hashed)")
    repair.add_argument("--thread", default=None, metavar="T", help="the source's thread (with --host; hashed)")
    repair.add_argument(
        "--source",
        default=None,
        metavar="SOURCE_SHA256",
        help="the source's hash, as `throughline quarantine` prints it",
    )
    repair.add_argument("--reason", required=True, metavar="TEXT", help="why the chain as applied is accepted")
    repair.add_argument("--dry-run", action="store_true", help="print what the repair would change; append nothing")


def _cmd_repair(args: argparse.Namespace) -> int:
    from throughline.producers.producer import PRODUCER_VERSION, TurnProducer

    settings = settings_from(args)
    if args.source is not None and (args.host is not None or args.thread is not None):
        raise RepairArgumentsError("name the source by --host and --thread, or by --source, not both")
    repair = build_repair(
        project=args.project,
        host=args.host,
        thread=args.thread,
        source=None if args.source is None else parse_source_hash(args.source),
        reason=args.reason,
        producer_name=REPAIR_PRODUCER_NAME,
        producer_version=PRODUCER_VERSION,
        produced_at_micros=time.time_ns() // 1000,
    )
    if args.dry_run:
        print(json.dumps(dry_run_document(settings.db, settings.topic, repair), indent=2))
        return 0
    servers = settings.require_bootstrap()
    # ensure=False: a repair never creates the topic (there is nothing to repair in a new one).
    with TurnProducer(
        servers, settings.topic, ensure=False, producer_name=REPAIR_PRODUCER_NAME, kafka_config=settings.kafka_config()
    ) as producer:
        position = producer.send_repair(repair)
    print(
        json.dumps(
            {
                "topic": settings.topic,
                "repair": repair_json(repair),
                "appended": {"partition": position.partition, "offset": position.offset},
            },
            indent=2,
        )
    )
    print(
        f"repair appended at p{position.partition}@{position.offset}; it takes effect when the projector applies "
        "that offset (see `throughline quarantine`)",
        file=sys.stderr,
    )
    return 0


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
    from throughline.projector.store import DuckProjection

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
