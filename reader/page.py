"""``read_observer_turn_page``: one page of a pinned read series (docs/spec.md#read-contract).

The order of checks is part of the contract:

1. Input: ``limit`` (1..100, default 10), the project, both cursors' shapes, the body bound. Any fault
   is a hard input error with a stable code (CLI exit 2).
2. The page token, before any resync decision: a token needs the through cursor it is bound to
   (``page_token_unbound``); then it must verify under the key and match the exact project, after and
   through the caller sent. Every token fault is a hard input error, never ``resync_required``.
3. ``resync_required`` for a cursor of another version, of another project, or on another partition
   than the project's.
4. Freshness (docs/spec.md#freshness). A first page without a through cursor reads the partition's end
   offset *now* and waits (bounded by ``wait_timeout``) until the projector has applied it, then pins
   the head of the project's chain once; its string is the through cursor of the whole series. A page
   with a through cursor waits until the projector has applied the record that made it (and the after
   cursor's). Not reached in time: ``projection_pending``. A cursor naming a log position at or past
   the partition's end offset cannot have come from this log (the topic was recreated):
   ``resync_required``.
5. Inside ONE projection snapshot (every row of a page comes from one DuckDB snapshot; the projection's
   ``read``, which may answer without a transaction and reads again in a snapshot when a commit
   overtook it, docs/design.md "Quiet reads"): through and
   after are re-validated as prefixes of their chains (vanished source, rollback, re-extension after a
   rollback: ``resync_required``; a source with a quarantined record: ``SourceQuarantinedError``); the
   page is planned (``throughline.core.page_range``); its rows are read and verified: every seq
   present, each content digest recomputed, the chain linked from ``d(page_start)``, and the last row
   equal to the through cursor when the page ends there. Any row missing or disagreeing:
   ``projection_pending`` with no turns and no token, never a partial page.
6. ``ok``: turns in seq order, each body cut to ``body_limit`` UTF-8 bytes at a character boundary
   (``bodyTruncated``; ``bodyBytes`` and ``contentDigest`` describe the full body), and the token of
   the next page when the series has more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from throughline.core.chain import CHAIN_ORIGIN, content_digest, next_chain_digest
from throughline.core.cursor import Cursor, ForeignCursor, decode_cursor
from throughline.core.identity import project_sha256
from throughline.core.page_range import DEFAULT_LIMIT, ThroughBeforeAfter, plan_page
from throughline.core.page_token import SeriesBinding, issue_page_token, open_page_token
from throughline.core.ports import (
    LogView,
    Projection,
    ProjectionView,
    SourceInfo,
    StoredTurn,
)
from throughline.core.turn import format_rfc3339
from throughline.reader.exceptions import (
    InvalidBodyLimitError,
    PageTokenUnboundError,
    SourceQuarantinedError,
    TokenKeyError,
)
from throughline.reader.request import ReadRequest, require_seconds
from throughline.reader.wire import (
    STATUS_OK,
    STATUS_PENDING,
    STATUS_RESYNC,
    ObserverRead,
    PageWire,
    ThreadIdentity,
    TurnRecordWire,
)

#: Default bound on a served body, in UTF-8 bytes (64 KiB). A longer body is cut at a character
#: boundary; its turn record keeps ``bodyBytes`` (the full length) and ``contentDigest`` (of the full
#: body). Ten turns at the bound keep a page under a megabyte. ``--body-limit`` / ``body_limit`` change it.
DEFAULT_BODY_LIMIT = 64 * 1024
#: Default bounded wait for the projector to apply the log as it stood at the call (docs/spec.md#freshness).
DEFAULT_WAIT_TIMEOUT = 2.0
#: Shortest page-token key accepted (HMAC-SHA-256 keys shorter than the hash weaken it).
MIN_TOKEN_KEY_BYTES = 32


@dataclass(frozen=True, slots=True)
class _Verdict:
    """A reason not to serve the page: ``status`` is pending or resync."""

    status: Literal["projection_pending", "resync_required"]
    reason: str


def read_observer_turn_page(
    *,
    project: str,
    after_cursor: str | None = None,
    through_cursor: str | None = None,
    page_token: str | None = None,
    limit: int | None = 10,
    projection: Projection,
    log: LogView,
    token_key: bytes,
    wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
    body_limit: int = DEFAULT_BODY_LIMIT,
) -> ObserverRead:
    """Read one page of the series (``after_cursor``, ``through_cursor``) of ``project``.

    First call of a series: ``through_cursor=None`` and ``page_token=None``; the answer pins the
    through cursor. Later pages pass the same ``after_cursor``, the returned ``throughCursor`` and the
    returned ``page.nextToken``. Hard input errors raise ``InputError`` subclasses (stable ``code``);
    a quarantined source raises ``SourceQuarantinedError``; ``projection_pending`` and
    ``resync_required`` are answers, not errors. The same as ``read_page`` with a ``ReadRequest``.
    """
    request = ReadRequest(
        project=project,
        after_cursor=after_cursor,
        through_cursor=through_cursor,
        page_token=page_token,
        limit=DEFAULT_LIMIT if limit is None else limit,
    )
    return read_page(
        request,
        projection=projection,
        log=log,
        token_key=token_key,
        wait_timeout=wait_timeout,
        body_limit=body_limit,
    )


def read_page(
    request: ReadRequest,
    *,
    projection: Projection,
    log: LogView,
    token_key: bytes,
    wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
    body_limit: int = DEFAULT_BODY_LIMIT,
) -> ObserverRead:
    """Read the page ``request`` names (``read_observer_turn_page`` over a ``ReadRequest``).

    ``request.limit`` was validated when the request was made; ``request.wait`` (the long-poll) is the
    serve API's, not the reader's: this reads at once, waiting at most ``wait_timeout`` for the projector.
    """
    project, after_cursor, through_cursor = request.project, request.after_cursor, request.through_cursor
    page_token = request.page_token
    if isinstance(body_limit, bool) or not isinstance(body_limit, int) or body_limit < 0:
        raise InvalidBodyLimitError(f"body limit must be an integer >= 0, got {body_limit!r}")
    require_seconds(wait_timeout, "wait")
    if not isinstance(token_key, bytes) or len(token_key) < MIN_TOKEN_KEY_BYTES:
        raise TokenKeyError(f"the page-token key must be at least {MIN_TOKEN_KEY_BYTES} bytes")
    project_hash = project_sha256(project)
    after = None if after_cursor is None else decode_cursor(after_cursor, field="afterCursor")
    through = None if through_cursor is None else decode_cursor(through_cursor, field="throughCursor")

    offset: int | None = None
    if page_token is not None:
        if through_cursor is None:
            raise PageTokenUnboundError(
                "a page token is bound to its series: send it with the same afterCursor and throughCursor"
            )
        offset = open_page_token(token_key, page_token, SeriesBinding.of(project_hash, after_cursor, through_cursor))

    def answer(verdict: _Verdict, pinned: str | None = through_cursor) -> ObserverRead:
        # ``through`` is read when called: after pinning it is the pinned head.
        return _empty(verdict, after_cursor, pinned, through)

    partition = log.partition_of(project_hash)
    for name, cursor in (("after", after), ("through", through)):
        if isinstance(cursor, ForeignCursor):
            return answer(_Verdict(STATUS_RESYNC, f"the {name} cursor is of version {cursor.version}, not 1"))
        if cursor is not None and cursor.project_sha256 != project_hash:
            return answer(_Verdict(STATUS_RESYNC, f"the {name} cursor belongs to another project"))
        if cursor is not None and cursor.partition != partition:
            return answer(_Verdict(STATUS_RESYNC, f"the {name} cursor names another partition than the project's"))
    assert not isinstance(after, ForeignCursor) and not isinstance(through, ForeignCursor)

    end = log.end_offset(partition)
    for name, cursor in (("after", after), ("through", through)):
        if cursor is not None and cursor.offset >= end:
            return answer(_Verdict(STATUS_RESYNC, f"the {name} cursor names a log position this log does not hold"))
    need = (
        end if through is None else max(through.offset, after.offset if after else -1) + 1
    )  # mutant-anchor: after-wait-skipped
    # Every record of the project below ``need`` must be applied; records of other projects need not be
    # when the projection can prove that none of those it has not applied are the project's.
    if not projection.wait_settled(partition, project_hash, need, wait_timeout):
        return answer(_Verdict(STATUS_PENDING, f"the projector has not applied partition {partition} up to {need}"))

    def in_view(view: ProjectionView) -> ObserverRead:
        return _read_in_view(
            view, request, project_hash, after, through, offset, token_key=token_key, body_limit=body_limit
        )

    # One consistent snapshot, taken the projection's cheapest way (``Projection.read``: on DuckDB, without a
    # transaction while no commit is under way, and again in a snapshot when a commit overtook it).
    return projection.read(in_view)


def _read_in_view(
    view: ProjectionView,
    request: ReadRequest,
    project_hash: bytes,
    after: Cursor | None,
    through: Cursor | None,
    offset: int | None,
    *,
    token_key: bytes,
    body_limit: int,
) -> ObserverRead:
    """Steps 5 and 6 inside one snapshot ``view``: pin the head, check the cursors, read and verify the page."""
    after_cursor, through_cursor, limit = request.after_cursor, request.through_cursor, request.limit

    def answer(verdict: _Verdict, pinned: str | None = through_cursor) -> ObserverRead:
        return _empty(verdict, after_cursor, pinned, through)

    if through is None:  # mutant-anchor: latest-head
        head = view.head(project_hash)
        if head is None:
            if after is not None:
                return answer(_Verdict(STATUS_RESYNC, "the project has no turns: the after cursor's source vanished"))
            return ObserverRead(
                status=STATUS_OK,
                thread=None,
                afterCursor=None,
                throughCursor=None,
                turns=(),
                historyTruncated=False,
                page=PageWire(complete=True, nextToken=None),
            )
        through = head
        through_cursor = head.encode()  # pinned once: the through cursor of the whole series
    assert through_cursor is not None
    pinned = through_cursor

    # Everything the answer may need, read at once: the turn each cursor ends with (for a cursor
    # whose source passes its checks) and the page's turns. The verdicts below then follow the
    # order of checks exactly as if each had been read when it was needed.
    cursors = [(name, c, view.source(c.source_sha256)) for name, c in (("through", through), ("after", after)) if c]
    try:
        plan = plan_page(after, through, limit=limit, offset=offset)
    except ThroughBeforeAfter:
        plan = None
    ranges = [
        (c.source_sha256, c.length, c.length)
        for name, c, info in cursors
        if _source_verdict(info, c, project_hash, name) is None
    ]
    first = max(1, plan.page_start) if plan is not None else 1
    if plan is not None and plan.page_end >= first:
        ranges.append((plan.source_sha256, first, plan.page_end))
    fetched = dict(zip(ranges, view.turns_many(ranges), strict=True))

    for name, cursor, info in cursors:
        verdict = _source_verdict(info, cursor, project_hash, name)
        if verdict is None:
            verdict = _row_verdict(fetched[cursor.source_sha256, cursor.length, cursor.length], cursor, name)
        if isinstance(verdict, SourceQuarantinedError):
            raise verdict
        if verdict is not None:
            return answer(verdict, pinned)

    if plan is None:
        return answer(_Verdict(STATUS_RESYNC, "the through cursor is shorter than the after cursor"), pinned)
    rows = fetched.get((plan.source_sha256, first, plan.page_end), [])
    served = _verify_page(rows, plan.page_start, plan.page_end, through)
    if isinstance(served, _Verdict):
        return answer(served, pinned)  # mutant-anchor: partial-page

    next_token = None
    if plan.next_offset is not None:
        next_token = issue_page_token(token_key, SeriesBinding.of(project_hash, after_cursor, pinned), plan.next_offset)
    return ObserverRead(
        status=STATUS_OK,
        thread=ThreadIdentity(sourceSha256=through.source_sha256.hex()),
        afterCursor=after_cursor,
        throughCursor=pinned,
        turns=tuple(_wire_turn(row, body_limit) for row in served),
        historyTruncated=plan.history_truncated,
        page=PageWire(complete=plan.complete, nextToken=next_token),
    )


def _empty(
    verdict: _Verdict,
    after_cursor: str | None,
    through_cursor: str | None,
    through: Cursor | ForeignCursor | None,
) -> ObserverRead:
    """A pending or resync answer: no turns, no token, the cursors echoed."""
    thread = ThreadIdentity(sourceSha256=through.source_sha256.hex()) if isinstance(through, Cursor) else None
    return ObserverRead(
        status=verdict.status,
        thread=thread,
        afterCursor=after_cursor,
        throughCursor=through_cursor,
        turns=(),
        historyTruncated=False,
        page=PageWire(complete=False, nextToken=None),
        reason=verdict.reason,
    )


def _source_verdict(
    info: SourceInfo | None, cursor: Cursor, project_hash: bytes, name: str
) -> _Verdict | SourceQuarantinedError | None:
    """Is ``cursor``'s source, as this snapshot holds it, one the cursor can be a prefix of? (docs/spec.md#prefix-revalidation)

    A quarantined source is returned as the error to raise, so that the caller raises it in the order
    of checks.
    """
    if info is None:
        return _Verdict(STATUS_RESYNC, f"the {name} cursor's source vanished from the projection")
    if info.project_sha256 != project_hash:
        return _Verdict(STATUS_RESYNC, f"the {name} cursor's source belongs to another project")
    if info.broken_reason:
        return SourceQuarantinedError(
            f"the {name} cursor's source {cursor.source_sha256.hex()[:16]} has a quarantined record: list it "
            f"with `throughline quarantine`, then repair the source with `throughline repair --project P "
            f"--source {cursor.source_sha256.hex()} --reason TEXT` (docs/operations.md)"
        )
    if info.length < cursor.length:
        return _Verdict(STATUS_RESYNC, f"the {name} cursor's source was rolled back under it")
    return None


def _row_verdict(rows: list[StoredTurn], cursor: Cursor, name: str) -> _Verdict | None:
    """Is the turn ``cursor`` ends with (``rows``: the snapshot's rows of that seq) the one it names?"""
    if len(rows) != 1 or rows[0].seq != cursor.length:
        return _Verdict(STATUS_PENDING, f"the projection lacks the turn the {name} cursor ends with")
    row = rows[0]
    if row.chain_digest != cursor.chain_digest or (row.partition, row.offset) != (
        cursor.partition,
        cursor.offset,
    ):
        return _Verdict(STATUS_RESYNC, f"the {name} cursor's source was rolled back and re-extended")
    return None


def _verify_page(
    rows: list[StoredTurn], page_start: int, page_end: int, through: Cursor
) -> list[StoredTurn] | _Verdict:
    """The page's rows when the projection holds every one of them and they chain; else a pending verdict."""
    pending = _Verdict(STATUS_PENDING, "the projection lacks or disagrees with a turn of the page")
    if page_start > 0:
        if not rows or rows[0].seq != page_start:
            return pending
        previous = rows[0].chain_digest
        rows = rows[1:]
    else:
        previous = CHAIN_ORIGIN
    if [row.seq for row in rows] != list(range(page_start + 1, page_end + 1)):
        return pending
    for row in rows:
        digest = content_digest(row.turn_id, row.completed_at_micros, row.body)
        if digest != row.content_digest or row.body_bytes != len(row.body.encode("utf-8")):
            return pending
        previous = next_chain_digest(previous, digest)
        if previous != row.chain_digest:
            return pending
    if page_end == through.length and rows and rows[-1].chain_digest != through.chain_digest:
        return pending
    return rows


def cut_body(body: str, limit: int) -> tuple[str, int, bool]:
    """``(body cut to limit UTF-8 bytes at a character boundary, full byte length, was cut)``."""
    data = body.encode("utf-8")
    if len(data) <= limit:
        return body, len(data), False
    # Back off from the cut to the start of a character: UTF-8 continuation bytes are 0b10xxxxxx.
    cut = limit
    while cut > 0 and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return data[:cut].decode("utf-8"), len(data), True


def _wire_turn(row: StoredTurn, body_limit: int) -> TurnRecordWire:
    body, size, truncated = cut_body(row.body, body_limit)
    return TurnRecordWire(
        seq=row.seq,
        completedAt=format_rfc3339(row.completed_at_micros),
        body=body,
        bodyBytes=size,
        bodyTruncated=truncated,
        contentDigest=row.content_digest.hex(),
        chainDigest=row.chain_digest.hex(),
    )
