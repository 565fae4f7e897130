"""Which turns one page of a read series holds (docs/spec.md#read-range, #snapshot, #pagination), as pure arithmetic.

A series is one (after cursor, through cursor) pair. Its *range* is a half-open interval of seqs
``(range_start, range_end]`` of the through cursor's source:

- snapshot (no after cursor): the latest ``limit`` turns up to ``through.length``; older turns are
  announced by ``history_truncated`` and never paginated;
- delta (after and through name the same source): ``after.length .. through.length``;
- switch (another host or thread): ``0 .. through.length`` of the through cursor's source.

Delta and switch series paginate only when the range exceeds ``limit``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from throughline.core.cursor import Cursor
from throughline.core.exceptions import InvalidLimitError
from throughline.core.page_token import check_offset_in_range

MIN_LIMIT = 1
MAX_LIMIT = 100
DEFAULT_LIMIT = 10


def validate_limit(limit: object) -> int:
    """Return ``limit`` when it is an integer in 1..100 (``None`` means the default, 10)."""
    if limit is None:
        return DEFAULT_LIMIT
    if isinstance(limit, bool) or not isinstance(limit, int) or not MIN_LIMIT <= limit <= MAX_LIMIT:
        raise InvalidLimitError(f"limit must be an integer from {MIN_LIMIT} to {MAX_LIMIT}, got {limit!r}")
    return limit


class RangeKind(StrEnum):
    """Which seqs a series' range covers: the latest ``limit`` (snapshot), after..through (delta), 0..through (switch).

    Not the Observer's ``SeriesOutcome``, which also names a series over a project with no turns.
    """

    SNAPSHOT = "snapshot"
    DELTA = "delta"
    SWITCH = "switch"


@dataclass(frozen=True, slots=True)
class PagePlan:
    """One page of a series: the seqs ``(page_start, page_end]`` of ``source_sha256``'s chain."""

    kind: RangeKind
    source_sha256: bytes
    range_start: int
    range_end: int
    page_start: int
    page_end: int
    history_truncated: bool
    next_offset: int | None

    @property
    def complete(self) -> bool:
        """True on the last page of the series."""
        return self.next_offset is None

    @property
    def seqs(self) -> range:
        """The seqs this page serves, in order."""
        return range(self.page_start + 1, self.page_end + 1)


class ThroughBeforeAfter(Exception):
    """The through cursor is shorter than the after cursor on the same source (resync_required)."""


def plan_page(after: Cursor | None, through: Cursor, *, limit: int, offset: int | None) -> PagePlan:
    """Plan the page of the series (after, through) that starts at ``offset`` (``None``: first page).

    Raises ``ThroughBeforeAfter`` for a through cursor behind its after cursor on the same source and
    ``PageTokenError`` (code ``page_token_offset``) for an offset past the range.
    """
    limit = validate_limit(limit)
    if after is None:
        start = max(0, through.length - limit)
        if offset is not None:
            check_offset_in_range(offset, 0)  # a snapshot is one complete page: no token can follow it
        return PagePlan(
            RangeKind.SNAPSHOT, through.source_sha256, start, through.length, start, through.length, start > 0, None
        )
    if after.source_sha256 == through.source_sha256:
        if through.length < after.length:
            raise ThroughBeforeAfter()
        kind, start = RangeKind.DELTA, after.length
    else:
        kind, start = RangeKind.SWITCH, 0
    size = through.length - start
    if offset is None:
        offset = 0
    else:
        check_offset_in_range(offset, size)
    page_start = start + offset
    page_end = min(through.length, page_start + limit)
    next_offset = None if page_end >= through.length else page_end - start
    return PagePlan(kind, through.source_sha256, start, through.length, page_start, page_end, False, next_offset)
