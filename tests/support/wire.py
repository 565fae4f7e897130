"""The read wire's field sets as docs/spec.md#read-wire lists them (written from the spec, not from the code)."""

from __future__ import annotations

#: The top-level fields of a ``throughline.observer_read.v1`` document, every status.
READ_FIELDS = frozenset(
    {"schema", "status", "thread", "afterCursor", "throughCursor", "turns", "historyTruncated", "page"}
)
