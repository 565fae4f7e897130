"""The read wire's field sets as ADR 0005 decision 9 lists them (written from the ADR, not from the code)."""

from __future__ import annotations

#: The top-level fields of a ``throughline.observer_read.v1`` document, every status.
READ_FIELDS = frozenset(
    {"schema", "status", "thread", "afterCursor", "throughCursor", "turns", "historyTruncated", "page"}
)
