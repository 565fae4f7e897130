"""``throughline quarantine [--json] [--project P]``: the quarantined records, the broken sources and the repairs, hashes only.

The projection is opened read-only, like ``status`` (so this fails with ``projection_busy`` while a
projector process holds the file). Nothing raw is printed: a record is its log position, its reason
code and text, the hashes of its project and source when it decoded far enough to name them, its size,
when its producer wrote it, and the repair that marked it; a broken source is its hash, its project's
hash, its chain's length as applied, the record that broke it and how many of its quarantined records
no repair has marked yet. The operator names a project with ``--project`` (hashed here), and a source
to ``throughline repair`` by the ``sourceSha256`` printed here, or by host and thread.

Document ``throughline.quarantine.v1`` (``--json``); the table is the same facts for a terminal.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import TYPE_CHECKING, Any

from throughline.commands.options import add_json_flag, command, settings_from
from throughline.core.identity import project_sha256
from throughline.core.turn import format_rfc3339

if TYPE_CHECKING:  # the store (DuckDB) loads only when a projection is opened
    from throughline.projector.store import QuarantineListing

QUARANTINE_SCHEMA = "throughline.quarantine.v1"


def register(subparsers: Any) -> None:
    """Add ``quarantine`` to the ``throughline`` parser."""
    quarantine = command(
        subparsers,
        "quarantine",
        _cmd_quarantine,
        help="quarantined records, broken sources and repairs (hashes only)",
        description="List the projection's quarantined records (position, reason code and text, source and "
        "project hashes, when), its broken sources with counts, and the repairs applied. Reads --db.",
    )
    add_json_flag(quarantine)
    quarantine.add_argument("--project", default=None, metavar="P", help="only this project (its name; it is hashed)")


def _cmd_quarantine(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    project_hash = None if args.project is None else project_sha256(args.project)
    doc = collect_quarantine(settings.db, settings.topic, project_hash)
    print(json.dumps(doc, indent=2) if args.json else render_quarantine(doc))
    return 0


def _hex(value: bytes | None) -> str | None:
    return None if value is None else value.hex()


def _position(value: tuple[int | None, int | None] | None) -> dict[str, int] | None:
    if value is None or value[0] is None or value[1] is None:
        return None
    return {"partition": value[0], "offset": value[1]}


def _when(micros: int | None) -> str | None:
    return None if micros is None else format_rfc3339(micros)


def quarantine_document(
    db: str, topic: str | None, project_sha256: bytes | None, listing: QuarantineListing
) -> dict[str, Any]:
    """The listing as one JSON-ready document (``throughline.quarantine.v1``)."""
    unrepaired = Counter(
        q.source_sha256 for q in listing.records if q.repaired_by is None and q.source_sha256 is not None
    )
    by_code = Counter(q.code for q in listing.records)
    repaired = sum(1 for q in listing.records if q.repaired_by is not None)
    return {
        "schema": QUARANTINE_SCHEMA,
        "db": db,
        "topic": topic,
        "projectSha256": _hex(project_sha256),
        "counts": {
            "records": len(listing.records),
            "unrepaired": len(listing.records) - repaired,
            "repaired": repaired,
            "brokenSources": len(listing.broken),
            "repairs": len(listing.repairs),
            "byCode": dict(sorted(by_code.items())),
        },
        "records": [
            {
                "partition": q.partition,
                "offset": q.offset,
                "code": q.code,
                "reason": q.reason,
                "projectSha256": _hex(q.project_sha256),
                "sourceSha256": _hex(q.source_sha256),
                "when": _when(q.produced_at_micros),
                "valueBytes": q.value_bytes,
                "repairedBy": _position(q.repaired_by),
            }
            for q in listing.records
        ],
        "brokenSources": [
            {
                "sourceSha256": b.source_sha256.hex(),
                "projectSha256": b.project_sha256.hex(),
                "length": b.length,
                "code": b.code,
                "reason": b.reason,
                "brokenAt": _position((b.partition, b.offset)),
                "unrepaired": unrepaired.get(b.source_sha256, 0),
            }
            for b in listing.broken
        ],
        "repairs": [
            {
                "partition": r.partition,
                "offset": r.offset,
                "projectSha256": r.project_sha256.hex(),
                "sourceSha256": r.source_sha256.hex(),
                "reason": r.reason,
                "outcome": r.outcome,
                "marked": r.marked,
                "length": r.length,
                "when": _when(r.produced_at_micros),
            }
            for r in listing.repairs
        ],
    }


def collect_quarantine(db: str, topic: str, project_sha256: bytes | None) -> dict[str, Any]:
    """Open the projection read-only and build the quarantine document of one project (or all)."""
    from throughline.projector.store import DuckProjection

    with DuckProjection.open(db, read_only=True, topic=topic) as projection:
        listing = projection.quarantine(project_sha256)
        return quarantine_document(db, projection.topic, project_sha256, listing)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _short(hex_text: str | None) -> str:
    return "-" if hex_text is None else hex_text[:16]


def log_position(doc: dict[str, Any] | None) -> str:
    """``p{partition}@{offset}`` of a document's log position (``-`` for none)."""
    return "-" if doc is None else f"p{doc['partition']}@{doc['offset']}"


def repaired_mark(record: dict[str, Any]) -> str:
    """``  repaired by pP@O`` for a quarantined record a repair marked, else nothing."""
    by = record["repairedBy"]
    return f"  repaired by {log_position(by)}" if by else ""


def _section(title: str, rows: list[str]) -> list[str]:
    return [title, *rows] if rows else []


def render_quarantine(doc: dict[str, Any]) -> str:
    """The quarantine as text for a terminal (sources in full: ``repair --source`` takes them)."""
    c = doc["counts"]
    scope = f"project {doc['projectSha256'][:16]}" if doc["projectSha256"] else "all projects"
    lines = [
        f"quarantine of projection {doc['db']}  topic {doc['topic']}  ({scope})",
        f"{_count(c['records'], 'quarantined record')} ({c['unrepaired']} unrepaired, {c['repaired']} repaired), "
        f"{_count(c['brokenSources'], 'broken source')}, {_count(c['repairs'], 'repair')}",
    ]
    if c["byCode"]:
        lines.append("by code: " + ", ".join(f"{code} {n}" for code, n in c["byCode"].items()))
    lines += _section(
        "broken sources (repair with: throughline repair --project P --source SOURCE --reason TEXT):",
        [
            f"  source {b['sourceSha256']}  project {_short(b['projectSha256'])}  length {b['length']}  "
            f"broken at {log_position(b['brokenAt'])} ({b['code'] or '-'}: {b['reason']})  {b['unrepaired']} unrepaired"
            for b in doc["brokenSources"]
        ],
    )
    lines += _section(
        "quarantined records:",
        [
            f"  {log_position(q)}  {q['when'] or '-'}  {q['code']}: {q['reason']}  "
            f"source {_short(q['sourceSha256'])} project {_short(q['projectSha256'])}  {q['valueBytes']} bytes"
            f"{repaired_mark(q)}"
            for q in doc["records"]
        ],
    )
    lines += _section(
        "repairs:",
        [
            f"  {log_position(r)}  {r['when'] or '-'}  {r['outcome']}  source {_short(r['sourceSha256'])}  "
            f"accepted length {r['length']}, marked {r['marked']}: {r['reason']}"
            for r in doc["repairs"]
        ],
    )
    return "\n".join(lines)
