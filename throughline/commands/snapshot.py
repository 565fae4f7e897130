"""``throughline snapshot`` and ``throughline load-snapshot``: projection snapshots on the command line
(docs/operations.md "Projection snapshots").

``snapshot --db FILE --out DIR [--partitions 0,2]`` writes a consistent cut of a projection file that no
projector holds (a running ``serve`` hands one out at ``GET /v1/admin/snapshot`` instead);
``load-snapshot --from DIR --db NEW_FILE`` builds a new projection file from one, checked against the log,
for a projector or ``serve`` to catch up from. Each prints a JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from throughline.commands.options import add_connection_options, settings_from


def register(subparsers: Any) -> None:
    """Add the ``snapshot`` and ``load-snapshot`` subcommands."""
    snap = subparsers.add_parser(
        "snapshot",
        help="write a projection snapshot (Parquet files + manifest) of a projection file",
        description="Write a consistent projection snapshot of --db into the new directory --out: one Parquet file "
        "per table with the rows of the chosen partitions, and manifest.json with their applied offsets and the "
        "files' SHA-256. The file is opened read-only: stop its projector, or take the snapshot from a running "
        "serve (GET /v1/admin/snapshot).",
    )
    snap.add_argument("--out", required=True, metavar="DIR", help="new (or empty) directory to write the snapshot to")
    snap.add_argument(
        "--partitions", default=None, metavar="LIST", help="only these partitions, e.g. 0,2,5 (default: every one)"
    )
    snap.add_argument("--db", default=None, help="the projection file (env THROUGHLINE_DB)")
    snap.set_defaults(func=_cmd_snapshot)

    load = subparsers.add_parser(
        "load-snapshot",
        help="build a new projection file from a projection snapshot, checked against the log",
        description="Build the new projection file --db from the snapshot directory --from: the manifest's format, "
        "every file's SHA-256, the topic, its id and partition count and the log's end offsets are checked first. "
        "A projector (project, serve) on --db then catches up from the snapshot's offsets.",
    )
    load.add_argument("--from", dest="source", required=True, metavar="DIR", help="the snapshot directory")
    add_connection_options(load)
    load.set_defaults(func=_cmd_load)


def _summary(manifest: Any, **extra: Any) -> str:
    doc = manifest.to_json()
    return json.dumps(
        {
            **extra,
            "topic": doc["topic"],
            "topicId": doc["topicId"],
            "partitions": doc["partitions"],
            "nextOffsets": {str(p): o for p, o in sorted(manifest.next_offsets().items())},
            "rows": {t: v["rows"] for t, v in doc["tables"].items()},
            "bytes": sum(v["bytes"] for v in doc["tables"].values()),
        }
    )


def _cmd_snapshot(args: argparse.Namespace) -> int:
    from throughline.projector.cut_load import take_cut
    from throughline.projector.cut_manifest import parse_partitions
    from throughline.projector.store import DuckProjection

    settings = settings_from(args)
    partitions = parse_partitions(args.partitions)
    with DuckProjection.open(settings.db, read_only=True) as projection:
        manifest = take_cut(projection, Path(args.out), partitions)
    print(_summary(manifest, out=str(args.out)))
    return 0


def _cmd_load(args: argparse.Namespace) -> int:
    from throughline.projector.cut_load import load_cut_into

    settings = settings_from(args)
    manifest = load_cut_into(
        Path(args.source),
        Path(settings.db),
        bootstrap_servers=settings.require_bootstrap(),
        topic=settings.topic,
        kafka_config=settings.kafka_config(),
    )
    print(_summary(manifest, db=str(settings.db)))
    return 0
