"""``throughline status --url U1,U2,...``: the readiness of a running ``serve`` (or of a group's members)
as a document and a table (the command itself is ``throughline.commands.status``).

The projection file of a running ``serve`` is held by its process, so ``status`` asks the service
instead: ``GET /readyz`` (docs/http.md) through an ``HttpReader``, which fails over along the URLs on
a connection error or a 503 (not ready), so a group answers from the first member that is ready, or
with the last member's 503 document when none is. Either is the command doing its job (exit 0); no
member answering at all is ``server_unavailable`` (exit 1).
"""

from __future__ import annotations

from typing import Any

from throughline.log.policy import replication_lines

READY_PATH = "/readyz"


def status_document(url: str, http_status: int, readiness: dict[str, Any]) -> dict[str, Any]:
    """What ``status --url --json`` prints: which member answered, whether it is ready, its document."""
    return {"url": url, "ready": http_status == 200, "readiness": readiness}


def render_remote_status(doc: dict[str, Any]) -> str:
    """The remote status as a human-readable table."""
    readiness = doc["readiness"]
    lines = [
        f"serve at {doc['url']}: {'ready' if doc['ready'] else 'not ready'} "
        f"(projector {readiness.get('projector', '-')}, lag {readiness.get('lag', '-')}, max lag {readiness.get('maxLag', '-')})"
    ]
    for key in ("logError", "projectorError"):
        error = readiness.get(key)
        if isinstance(error, dict):
            lines.append(f"{key}: {error.get('code')}: {error.get('message')}")
    group = readiness.get("group")
    if isinstance(group, dict):
        lines += _group_lines(group)
    replication = readiness.get("replication")
    if isinstance(replication, dict):
        lines += replication_lines(replication)
    error = readiness.get("replicationError")
    if isinstance(error, dict):
        lines.append(f"replicationError: {error.get('code')}: {error.get('message')}")
    columns = ("partition", "appliedOffset", "endOffset", "lag") + (("held",) if isinstance(group, dict) else ())
    names = ("partition", "applied", "end", "lag", "held")[: len(columns)]
    if isinstance(replication, dict):  # a serve that reports replication: its per-partition columns too
        columns += ("leader", "replicas", "isr", "underReplicated")
        names += ("leader", "replicas", "isr", "under-replicated")
    rows: list[tuple[str, ...]] = [names]
    for p in readiness.get("partitions") or []:
        if isinstance(p, dict):
            rows.append(tuple(_cell(p.get(k)) for k in columns))
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines += ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):  # broker ids
        return ",".join(map(str, value))
    return str(value)


def _group_lines(group: dict[str, Any]) -> list[str]:
    """A group member's view: the group, this member, and every member's partitions."""
    if not group.get("joined"):
        return [f"group {group.get('name')}: this member ({group.get('url')}) is joining"]
    lines = [
        f"group {group.get('name')}: generation {group.get('generation')}, {group.get('copies')} copies; "
        f"this member {group.get('url')} holds {group.get('held')} (catching up {group.get('catchingUp')}, "
        f"lag {group.get('heldLag')})"
    ]
    for member in group.get("members") or []:
        if isinstance(member, dict):
            lines.append(f"  member {member.get('url')}: partitions {member.get('partitions')}")
    return lines
