"""The line source of one host format: what ``ingest --format NAME`` reads.

A line host's JSON Lines files (``ingest.sessions.SessionFiles``), plus its whole-document sessions when
it has some (``records.DocumentSource``); a row host's own source (``HostAdapter.open_source``).
"""

from __future__ import annotations

from typing import Any

from throughline.producers.hosts.records import CombinedSource, DocumentSource
from throughline.producers.hosts.registry import adapter
from throughline.producers.ingest.sessions import SessionFiles

__all__ = ["session_source"]


def session_source(format: str, roots: list[str], **options: Any) -> Any:
    """The source of ``format``'s sessions under ``roots`` (options: ``follow``, ``states``,
    ``poll_interval``, ``notice``, ``settle``, ``final``; as ``SessionFiles`` takes them)."""
    host = adapter(format)
    if host.reads == "rows":
        # a row host presents a turn only once its rows say it ended: it has nothing to settle
        rows = {k: v for k, v in options.items() if k not in ("settle", "final")}
        return host.open_source(roots, **rows)
    files = SessionFiles(format, roots, **options)
    if not host.has_documents:
        return files
    return CombinedSource([files, DocumentSource(host, roots, **options)])
