"""The reference Observer (docs/spec.md#observer).

An Observer keeps one after cursor in its Observer state file (not the ingest state file of
``producers/ingest``). ``run_series`` reads one series page by page, hands every turn to an audit step,
and saves the series' through cursor as the new after cursor only when every page was read and every
turn audited. A crash, a cancel, a failed audit, a hard failure,
``projection_pending`` (after the bounded wait) and ``resync_required`` (under the ``fail`` policy) all
leave the old cursor in place, so killing the process at any instant leaves the state at the last fully
audited series.

Observer state file (``throughline.observer_state.v1``)::

    {"schema": "throughline.observer_state.v1", "afterCursor": "tlc1...." | null}

It is replaced atomically and durably: written to a temporary file in the same directory, fsynced,
renamed over the old one, and the directory fsynced.

Policies:

- ``projection_pending``: back off (doubling from ``pending_backoff`` up to ``pending_backoff_max``)
  and retry the same page; give up with ``ProjectionPendingError`` (retriable) once the pending streak
  has lasted ``max_pending_wait`` seconds. A retriable error from the read itself (a busy projection
  file, a broker that is briefly away) is treated the same way.
- ``resync_required`` with ``on_resync="snapshot"`` (the default): when the series had pinned a
  through cursor, the through cursor is dropped first and the series restarts from the same after
  cursor (only the pinned upper bound became invalid, for example a rollback mid-series); when the
  after cursor itself is refused, it is discarded, the Observer says so, and it reads a fresh snapshot
  series (only the latest ``limit`` turns; older ones are announced by ``historyTruncated``). With
  ``on_resync="fail"`` it raises ``ResyncRequiredError`` at once.

The Observer reads through a callable (``PageReader``), so the same client drives the library directly
(``functools.partial(read_observer_turn_page, projection=..., log=..., token_key=...)``) or a remote API.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Literal, Protocol

from throughline.core.cursor import Cursor, decode_cursor
from throughline.core.page_range import validate_limit
from throughline.durable import replace_file
from throughline.errors import InputError, ThroughlineError
from throughline.reader.exceptions import (
    InvalidBackoffError,
    InvalidResyncPolicyError,
    ObserverInterrupted,
    ObserverProtocolError,
    ObserverStateError,
    ObserverStateWriteError,
    ProjectionPendingError,
    ResyncRequiredError,
)
from throughline.reader.wire import STATUS_OK, STATUS_PENDING, ObserverRead, TurnRecordWire

OBSERVER_STATE_SCHEMA = "throughline.observer_state.v1"
_MAX_STATE_BYTES = 64 * 1024
#: Bound on the pages of one series: a series of limit 1 over a chain of this many turns is refused as
#: a protocol error rather than looping (chains are far shorter in practice).
MAX_PAGES_PER_SERIES = 10_000_000
#: Bound on restarts of one ``run_series`` (a fresh through, then a fresh snapshot, and spare).
MAX_RESTARTS = 4

ResyncPolicy = Literal["snapshot", "fail"]


class PageReader(Protocol):
    """Reads one page; ``read_observer_turn_page`` with its handles bound fits, as does an HTTP client."""

    def __call__(
        self,
        *,
        project: str,
        after_cursor: str | None,
        through_cursor: str | None,
        page_token: str | None,
        limit: int,
    ) -> ObserverRead: ...


class SeriesOutcome(StrEnum):
    """What a completed ``run_series`` read: nothing (no turns yet), a snapshot, a delta or a switch."""

    EMPTY = "empty"  # the project has no turns yet
    SNAPSHOT = "snapshot"
    DELTA = "delta"
    SWITCH = "switch"


@dataclass(frozen=True, slots=True)
class SeriesSummary:
    """What one ``run_series`` did."""

    kind: SeriesOutcome
    turns_audited: int
    pages: int
    history_truncated: bool
    previous_cursor: str | None
    through_cursor: str | None
    saved: bool  # the state file now holds through_cursor
    resynced: bool  # the old after cursor was discarded for a fresh snapshot
    pending_retries: int

    def describe(self) -> str:
        """One line for a person."""
        parts = [f"series: {self.kind}", f"turns audited: {self.turns_audited}", f"pages: {self.pages}"]
        if self.history_truncated:
            parts.append("history truncated (older turns exist before this snapshot)")
        if self.resynced:
            parts.append("after cursor discarded for a fresh snapshot (resync)")
        if self.pending_retries:
            parts.append(f"retries while the projection was pending: {self.pending_retries}")
        parts.append("new cursor saved" if self.saved else "cursor unchanged")
        return "; ".join(parts)


# ------------------------------------------------------------------------------------------------ state


def load_observer_state(path: str | os.PathLike[str]) -> str | None:
    """The saved after cursor (``None`` when the file does not exist or holds null)."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(_MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ObserverStateError(f"cannot read the observer state file {path}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ObserverStateError(f"the observer state file {path} is not JSON") from None
    if (
        len(raw) > _MAX_STATE_BYTES
        or not isinstance(doc, dict)
        or set(doc) != {"schema", "afterCursor"}
        or doc["schema"] != OBSERVER_STATE_SCHEMA
    ):
        raise ObserverStateError(f"the observer state file {path} is not a {OBSERVER_STATE_SCHEMA} document")
    cursor = doc["afterCursor"]
    if cursor is not None:
        try:
            decode_cursor(cursor, field="afterCursor")
        except InputError:
            raise ObserverStateError(f"the observer state file {path} holds a malformed cursor") from None
    return cursor


def save_observer_state(path: str | os.PathLike[str], after_cursor: str | None) -> None:
    """Replace the state file atomically and durably (temp file, fsync, rename, fsync directory)."""
    target = Path(path)
    data = json.dumps({"schema": OBSERVER_STATE_SCHEMA, "afterCursor": after_cursor}, sort_keys=True).encode() + b"\n"
    try:
        replace_file(target, data)
    except OSError as exc:
        # Whatever stopped the save (a full disk, an interrupt), the old state file is untouched.
        raise ObserverStateWriteError(f"cannot save the observer state {target}: {exc.strerror or exc}") from None


# --------------------------------------------------------------------------------------------- observer


class Observer:
    """Reads series of one project and audits every turn; see the module docstring for the policies."""

    def __init__(
        self,
        read_page: PageReader,
        *,
        project: str,
        state_path: str | os.PathLike[str],
        audit: Callable[[TurnRecordWire], None],
        limit: int = 10,
        on_resync: ResyncPolicy = "snapshot",
        pending_backoff: float = 0.1,
        pending_backoff_max: float = 2.0,
        max_pending_wait: float = 60.0,
        notify: Callable[[str], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if on_resync not in ("snapshot", "fail"):
            raise InvalidResyncPolicyError(f"on_resync must be 'snapshot' or 'fail', got {on_resync!r}")
        if not (0 < pending_backoff <= pending_backoff_max) or max_pending_wait < 0:
            raise InvalidBackoffError("backoff must be > 0 and <= its maximum; the pending wait >= 0")
        self.read_page = read_page
        self.project = project
        self.state_path = Path(state_path)
        self.audit = audit
        self.limit = validate_limit(limit)
        self.on_resync = on_resync
        self.pending_backoff = pending_backoff
        self.pending_backoff_max = pending_backoff_max
        self.max_pending_wait = max_pending_wait
        self.notify = notify or (lambda _message: None)
        self.should_stop = should_stop or (lambda: False)
        self.sleep = sleep
        self.clock = clock
        self._reading = False  # inside ``read_page`` (see ``interrupt_read``)

    @property
    def after_cursor(self) -> str | None:
        """The cursor in the state file now."""
        return load_observer_state(self.state_path)

    def run_series(self) -> SeriesSummary:
        """Read and audit one whole series; save its through cursor only when all of it was audited."""
        previous = load_observer_state(self.state_path)
        after = previous
        resynced = False
        retries = 0
        for _restart in range(MAX_RESTARTS):
            outcome = self._series(after)
            retries += outcome.pending_retries
            if isinstance(outcome, _Finished):
                saved = False
                if outcome.through is not None and outcome.through != previous:
                    save_observer_state(self.state_path, outcome.through)
                    saved = True
                return SeriesSummary(
                    kind=_kind(after, outcome.through),
                    turns_audited=outcome.audited,
                    pages=outcome.pages,
                    history_truncated=outcome.history_truncated,
                    previous_cursor=previous,
                    through_cursor=outcome.through if outcome.through is not None else previous,
                    saved=saved,
                    resynced=resynced,
                    pending_retries=retries,
                )
            # resync_required
            if self.on_resync == "fail":
                raise ResyncRequiredError(f"the reader answered resync_required ({outcome.reason}); cursor unchanged")
            if outcome.pinned_through:
                self.notify(
                    f"resync_required mid-series ({outcome.reason}); restarting the series from the same after cursor"
                )
                continue
            if after is None:
                break  # a fresh snapshot itself was refused: nothing left to discard
            self.notify(
                f"resync_required ({outcome.reason}): discarding the saved after cursor and reading a fresh snapshot"
            )
            after = None
            resynced = True
        raise ResyncRequiredError("the reader kept answering resync_required; cursor unchanged")

    def run_forever(self, *, interval: float = 1.0, max_series: int | None = None) -> list[SeriesSummary]:
        """Run series until ``should_stop()`` (checked between pages and series) or ``max_series`` ran.

        A series that gave up on a pending projection is reported and retried after ``interval``;
        every other error ends the run (the cursor stays at the last fully audited series).
        """
        summaries: list[SeriesSummary] = []
        attempts = 0
        while max_series is None or attempts < max_series:
            attempts += 1
            if self.should_stop():
                break
            try:
                summaries.append(self.run_series())
            except ObserverInterrupted:
                break
            except ProjectionPendingError as exc:
                # Following is long-lived: a projector that is slow for a while is retried next series.
                self.notify(exc.message)
            else:
                self.notify(summaries[-1].describe())
            deadline = self.clock() + interval
            while not self.should_stop() and self.clock() < deadline:
                self.sleep(min(0.1, max(0.0, deadline - self.clock())))
        return summaries

    def interrupt_read(self) -> None:
        """End a read in progress at once, from a signal handler of the thread that runs the Observer.

        A following Observer spends most of its life in a long-poll (a first page the server holds
        until a turn arrives, up to half a minute); a stop asked meanwhile should not wait it out. Call
        it after making ``should_stop()`` true: when the Observer is inside ``read_page`` it raises
        ``ObserverInterrupted`` there (a signal handler's exception surfaces in the interrupted code), so
        the read is abandoned like a series stopped between pages: no page of it was audited, and the
        saved cursor stays. Anywhere else it does nothing and ``should_stop()`` ends the run at the next
        check. Reads have no side effects on the Observer's state, which is why only they are cut short.
        """
        if self._reading:
            raise ObserverInterrupted("stopped during a read; cursor unchanged")

    # ---------------------------------------------------------------------------------------- internals

    def _series(self, after: str | None) -> _Finished | _Resync:
        through: str | None = None
        token: str | None = None
        pages = audited = retries = 0
        history_truncated = False
        for _page in range(MAX_PAGES_PER_SERIES):
            read, page_retries = self._read_until_not_pending(after, through, token)
            retries += page_retries
            if read.status != STATUS_OK:
                return _Resync(read.reason or "no reason given", through is not None, retries)
            if through is None:
                through = read.throughCursor
            elif read.throughCursor != through:
                raise ObserverProtocolError("the reader answered with another through cursor mid-series")
            if read.afterCursor != after:
                raise ObserverProtocolError("the reader answered for another after cursor")
            for turn in read.turns:
                if self.should_stop():
                    raise ObserverInterrupted("stopped mid-series; cursor unchanged")
                self.audit(turn)
                audited += 1
            pages += 1
            history_truncated = history_truncated or read.historyTruncated
            if read.page.complete:
                return _Finished(through, pages, audited, history_truncated, retries)
            if through is None:
                raise ObserverProtocolError("an incomplete page without a through cursor")
            token = read.page.nextToken
            if self.should_stop():
                raise ObserverInterrupted("stopped mid-series; cursor unchanged")
        raise ObserverProtocolError(f"a series longer than {MAX_PAGES_PER_SERIES} pages")

    def _read_until_not_pending(
        self, after: str | None, through: str | None, token: str | None
    ) -> tuple[ObserverRead, int]:
        started = self.clock()
        backoff = self.pending_backoff
        retries = 0
        while True:
            try:
                self._reading = True
                try:
                    read = self.read_page(
                        project=self.project,
                        after_cursor=after,
                        through_cursor=through,
                        page_token=token,
                        limit=self.limit,
                    )
                finally:
                    self._reading = False
            except ObserverInterrupted:
                raise
            except ThroughlineError as exc:
                if not exc.retriable:
                    raise
                why = f"{exc.code}: {exc.message}"
            else:
                if read.status != STATUS_PENDING:
                    return read, retries
                why = read.reason or "projection_pending"
            waited = self.clock() - started
            if waited >= self.max_pending_wait:
                raise ProjectionPendingError(
                    f"still pending after {waited:.1f}s ({why}); cursor unchanged", retriable=True
                )
            if self.should_stop():
                raise ObserverInterrupted("stopped while the projection was pending; cursor unchanged")
            self.sleep(min(backoff, max(0.0, self.max_pending_wait - waited)))
            backoff = min(backoff * 2, self.pending_backoff_max)
            retries += 1


@dataclass(frozen=True, slots=True)
class _Finished:
    through: str | None
    pages: int
    audited: int
    history_truncated: bool
    pending_retries: int


@dataclass(frozen=True, slots=True)
class _Resync:
    reason: str
    pinned_through: bool
    pending_retries: int


def _kind(after: str | None, through: str | None) -> SeriesOutcome:
    if through is None:
        return SeriesOutcome.EMPTY
    if after is None:
        return SeriesOutcome.SNAPSHOT
    a, t = decode_cursor(after), decode_cursor(through)
    if isinstance(a, Cursor) and isinstance(t, Cursor) and a.source_sha256 == t.source_sha256:
        return SeriesOutcome.DELTA
    return SeriesOutcome.SWITCH
