"""``throughline status [--json]``: what the projection applied, what the log holds, and what was quarantined.

The projection is opened read-only (so this fails with ``projection_busy`` while a projector process
holds the file: ``serve`` exposes the same numbers over HTTP). The log part (end offsets, lag) needs a
broker; without one configured, or when it does not answer, the document says so and the projection
part is still reported. The topic's replication (each partition's leader, replicas and in-sync
replicas, whether it is under-replicated, and the topic's replication factor and
``min.insync.replicas``) is described beside the ends; when it cannot be, the log part says why
(``replicationError``) and the rest is reported. Never prints a body or a raw record: quarantine rows show their position,
code, reason and the hashes of their project and source when known.

With ``--url`` (or ``THROUGHLINE_URL``) it asks a running ``serve``, or a group's members, for its
readiness instead (``remote_status``; the document and its table are ``throughline.serve.remote_status``'s).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from throughline.commands.options import add_http_options, add_json_flag, command, http_reader_from_args, settings_from
from throughline.commands.quarantine import log_position, repaired_mark
from throughline.errors import ThroughlineError
from throughline.log import PLAINTEXT, KafkaClientConfig, KafkaLog, TopicInfo, describe_topic
from throughline.log.exceptions import MissingBootstrapServersError
from throughline.log.policy import replication_lines
from throughline.serve.client import ENV_URL
from throughline.serve.exceptions import BadResponseError
from throughline.serve.remote_status import READY_PATH, render_remote_status
from throughline.serve.remote_status import status_document as remote_status_document

if TYPE_CHECKING:  # the store (DuckDB) loads only when a projection is opened
    from throughline.projector.store import ProjectionStats

DEFAULT_STATUS_TIMEOUT = 10.0


def register(subparsers: Any) -> None:
    """Add ``status`` to the ``throughline`` parser."""
    status = command(
        subparsers,
        "status",
        _cmd_status,
        help="applied vs end offsets, lag, counts and quarantine",
        description="Report the projection's applied offsets against the log's end offsets, counts and quarantine.",
    )
    add_json_flag(status)
    status.add_argument("--quarantine", type=int, default=10, metavar="N", help="latest quarantined records to show")
    add_http_options(status, status=True)


def _cmd_status(args: argparse.Namespace) -> int:
    if args.url or os.environ.get(ENV_URL):  # a running serve (or a group's members) holds the file
        return remote_status(args)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    settings = settings_from(args)
    doc, log = collect_status(
        settings.db,
        settings.topic,
        settings.bootstrap_servers,
        latest=max(0, args.quarantine),
        kafka_config=settings.kafka_config(),
    )
    print(json.dumps(doc, indent=2) if args.json else render_status(doc))
    if settings.bootstrap_servers and log.error is not None:
        raise log.error  # with its own code and exit code (2 for settings that do not fit the cluster)
    return 0


def remote_status(args: argparse.Namespace) -> int:
    """``status --url``: print the readiness document of the first member that is ready (``--json``: as
    JSON); see ``throughline.serve.remote_status``."""
    reader = http_reader_from_args(args)
    assert reader is not None, "remote_status needs --url or THROUGHLINE_URL"
    with reader:
        status, readiness = reader.get_json(READY_PATH)
    if not isinstance(readiness, dict):
        raise BadResponseError(f"{reader.url}{READY_PATH} did not answer a readiness document")
    doc = remote_status_document(reader.url, status, readiness)
    print(json.dumps(doc, indent=2) if getattr(args, "json", False) else render_remote_status(doc))
    return 0


@dataclass(frozen=True, slots=True)
class LogEnds:
    """The log's end offsets, or why they are unknown."""

    ends: dict[int, int] | None
    partitions: int | None
    error: ThroughlineError | None
    kafka_config: KafkaClientConfig = PLAINTEXT
    topic: TopicInfo | None = None  # the topic's replication, when it could be described
    topic_error: ThroughlineError | None = None  # why it could not (with ends known)


def read_log_ends(
    bootstrap_servers: str | None,
    topic: str,
    *,
    timeout: float = DEFAULT_STATUS_TIMEOUT,
    kafka_config: KafkaClientConfig = PLAINTEXT,
) -> LogEnds:
    """The topic's end offsets now (``ends=None`` with the reason when they cannot be read)."""
    if not bootstrap_servers:
        return LogEnds(None, None, None, kafka_config)
    try:
        with KafkaLog(
            bootstrap_servers, topic, timeout=timeout, client_id="throughline-status", kafka_config=kafka_config
        ) as log:
            ends, partitions = log.end_offsets(), log.partitions
    except ThroughlineError as exc:
        return LogEnds(None, None, exc, kafka_config)
    try:
        info = describe_topic(bootstrap_servers, topic, timeout=timeout, kafka_config=kafka_config)
    except ThroughlineError as exc:
        return LogEnds(ends, partitions, None, kafka_config, topic_error=exc)
    return LogEnds(ends, partitions, None, kafka_config, topic=info)


def status_document(db: str, stats: ProjectionStats, log: LogEnds) -> dict[str, Any]:
    """The status as one JSON-ready document."""
    applied = {p.partition: p for p in stats.partitions}
    partitions = set(applied) | set(log.ends or {})
    rows: list[dict[str, Any]] = []
    total_lag: int | None = 0 if log.ends is not None else None
    for p in sorted(partitions):
        a = applied.get(p)
        next_offset = a.next_offset if a else 0
        end = log.ends.get(p) if log.ends is not None else None
        lag = max(0, end - next_offset) if end is not None else None
        if lag is not None and total_lag is not None:
            total_lag += lag
        rows.append(
            {
                "partition": p,
                "applied": next_offset,
                "end": end,
                "lag": lag,
                "records": a.records if a else 0,
                "turns": a.appended if a else 0,
                "rewinds": a.rewinds if a else 0,
                "duplicates": a.duplicates if a else 0,
                "quarantined": a.quarantined if a else 0,
                # leader, replicas, isr, underReplicated (absent when the replication is unknown)
                **(log.topic.partition_json(p) if log.topic is not None else {}),
            }
        )
    # Which protocol and mechanism the log is read with (never a credential).
    log_part: dict[str, Any] = {"reachable": log.ends is not None, "security": log.kafka_config.describe()}
    if log.error is not None:
        log_part["error"] = {"code": log.error.code, "message": log.error.message}
    elif log.ends is None:
        missing = MissingBootstrapServersError("no Kafka bootstrap servers configured")
        log_part["error"] = missing.to_json()["error"]
    if log.topic_error is not None:
        log_part["replicationError"] = {"code": log.topic_error.code, "message": log.topic_error.message}
    return {
        "db": db,
        "topic": stats.topic,
        "topicId": stats.topic_id,
        "log": log_part,
        "partitions": rows,
        "lag": total_lag,
        "replication": log.topic.replication_json() if log.topic is not None else None,
        "counts": {
            "turns": stats.turns,
            "sources": stats.sources,
            "projects": stats.projects,
            "superseded": stats.superseded,
            "quarantined": stats.quarantined,
            "brokenSources": stats.broken_sources,
            "repaired": stats.repaired,
            "repairs": stats.repairs,
        },
        "quarantine": [
            {
                "partition": q.partition,
                "offset": q.offset,
                "code": q.code,
                "reason": q.reason,
                "projectSha256": q.project_sha256.hex() if q.project_sha256 else None,
                "sourceSha256": q.source_sha256.hex() if q.source_sha256 else None,
                "valueBytes": q.value_bytes,
                "repairedBy": None
                if q.repaired_by is None
                else {"partition": q.repaired_by[0], "offset": q.repaired_by[1]},
            }
            for q in stats.latest_quarantine
        ],
    }


def collect_status(
    db: str,
    topic: str,
    bootstrap_servers: str | None,
    *,
    latest: int = 10,
    timeout: float = DEFAULT_STATUS_TIMEOUT,
    kafka_config: KafkaClientConfig = PLAINTEXT,
) -> tuple[dict[str, Any], LogEnds]:
    """Open the projection read-only, ask the log for its ends, and build the status document; return
    it with what the log said (``LogEnds.error`` is the typed error when the log could not be read)."""
    from throughline.projector.store import DuckProjection

    with DuckProjection.open(db, read_only=True, topic=topic) as projection:
        stats = projection.stats(latest_quarantine=latest)
    log = read_log_ends(bootstrap_servers, topic, timeout=timeout, kafka_config=kafka_config)
    return status_document(db, stats, log), log


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def _brokers(ids: object) -> str:
    return ",".join(str(i) for i in ids) if isinstance(ids, list) else "-"


def render_status(doc: dict[str, Any]) -> str:
    """The status as a human-readable table."""
    lines = [f"projection {doc['db']}  topic {doc['topic']}  (id {_cell(doc['topicId'])})"]
    log = doc["log"]
    security = log.get("security") or {}
    if security:
        mechanism = f" {security['saslMechanism']}" if security.get("saslMechanism") else ""
        lines.append(f"kafka connection: {security['securityProtocol']}{mechanism}")
    if not log["reachable"]:
        lines.append(f"log: unknown ({log['error']['message']})")
    if log.get("replicationError"):
        lines.append(f"replication: unknown ({log['replicationError']['message']})")
    keys = ("partition", "applied", "end", "lag", "records", "turns", "rewinds", "duplicates", "quarantined")
    header = (*keys, "leader", "replicas", "isr", "under-replicated")
    table = [header] + [
        (
            *(_cell(r[k]) for k in keys),
            _cell(r.get("leader")),
            _brokers(r.get("replicas")),
            _brokers(r.get("isr")),
            _cell(None if r.get("underReplicated") is None else ("yes" if r["underReplicated"] else "no")),
        )
        for r in doc["partitions"]
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        lines.append("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
    lines.append(f"total lag: {_cell(doc['lag'])}")
    replication = doc.get("replication")
    if replication:
        lines += replication_lines(replication)
    c = doc["counts"]
    lines.append(
        f"turns {c['turns']}  sources {c['sources']}  projects {c['projects']}  superseded {c['superseded']}  "
        f"quarantined {c['quarantined']} ({c['repaired']} repaired)  broken sources {c['brokenSources']}  "
        f"repairs {c['repairs']}"
    )
    if doc["quarantine"]:
        lines.append("latest quarantined records:")
        for q in doc["quarantine"]:
            source = f" source {q['sourceSha256'][:16]}" if q["sourceSha256"] else ""
            lines.append(
                f"  {log_position(q)} {q['code']}: {q['reason']}{source} ({q['valueBytes']} bytes){repaired_mark(q)}"
            )
    return "\n".join(lines)
