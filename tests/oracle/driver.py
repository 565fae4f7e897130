"""The driver: runs one generated history against production and hands every answer to the checker.

Production path: each ``Append``/``Rewind`` builds a turn with ``throughline.core.turn.build_turn`` and
encodes it with ``throughline.schemas.codec.encode_turn`` into the driver's log (one partition, a list
of records); ``Apply`` feeds pending records to the real projection's batch-apply path (the DuckDB
projection in a temporary file; the in-memory ``BookProjection`` is a second, faster target); every
read calls the production ``read_observer_turn_page`` over that projection and a ``FixedLog`` whose end
offset is the log's length, with ``wait_timeout=0`` so that lag is observed, not waited out.

The only thing between the reader and the projection is ``DamagedProjection``: a pass-through that can
hide or garble live turn rows, so that the oracle can check that a projection lacking or disagreeing
with a row yields ``projection_pending`` (a correct projector never loses a committed row, so the fault
has to be injected).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from support.projection import PassThroughView, PassThroughWaits

from throughline.core.memory import BookProjection, FixedLog
from throughline.core.ports import Projection, ProjectionView, StoredTurn
from throughline.core.repair import build_repair
from throughline.core.turn import build_turn
from throughline.errors import ThroughlineError
from throughline.schemas.codec import decode_record, encode_repair, encode_turn

from . import checker
from .checker import Outcome
from .grammar import (
    VARIANTS,
    Append,
    Apply,
    Damage,
    Fetch,
    Gap,
    Mend,
    Pick,
    Repair,
    Replay,
    Reread,
    Rewind,
    Start,
    Step,
)
from .model import ERROR, OK, PARTITION, PENDING, PROJECTS, SOURCES, Model, source_hash

TOKEN_KEY = bytes(range(32))


def production_reader() -> Callable[..., Any]:
    """The production ``read_observer_turn_page`` (looked up at call time, so a patched module is seen)."""
    import throughline.reader as reader_package

    exported: Callable[..., Any] | None = getattr(reader_package, "read_observer_turn_page", None)
    if exported is not None:
        return exported
    from throughline.reader.page import read_observer_turn_page

    return read_observer_turn_page


# ------------------------------------------------------------------------------------------ targets


class Target(Protocol):
    """A projection the driver can feed records to and the reader can read."""

    projection: Projection

    def apply(self, batch: list[tuple[bytes, bytes, int, int]]) -> None:
        """Apply (key, value, partition, offset) records, in order, as the projector does."""
        ...

    def fetch(self, batch: list[tuple[bytes, bytes, int, int]]) -> None:
        """Tell the projection the projector fetched these records and will apply them next (as the
        streaming projector does before each apply), so it knows their projects."""
        ...

    def close(self) -> None:
        """Release files and connections."""
        ...


class BookTarget:
    """The in-memory ``BookProjection`` (the same ``Projection`` protocol; no DuckDB)."""

    def __init__(self) -> None:
        self._book = BookProjection()
        self._book.fetching_from({PARTITION: 0})
        self.projection: Projection = self._book

    def apply(self, batch: list[tuple[bytes, bytes, int, int]]) -> None:
        for _key, data, partition, offset in batch:
            self._book.apply(decode_record(data), partition, offset)

    def fetch(self, batch: list[tuple[bytes, bytes, int, int]]) -> None:
        if batch:
            records = [(offset, decode_record(data).project_sha256) for _key, data, _p, offset in batch]
            self._book.fetched(PARTITION, records, batch[-1][3] + 1)

    def close(self) -> None:
        pass


def duck_target_factory() -> Callable[[], Target] | None:
    """A factory of DuckDB targets when the production DuckDB projection is available."""
    try:
        from throughline.projector import store
    except ImportError:
        return None
    if not hasattr(store, "DuckProjection"):
        return None
    return DuckTarget


class DuckTarget:
    """The production DuckDB projection in a temporary file, fed through its Kafka-free batch apply."""

    TOPIC = "throughline.oracle"

    def __init__(self) -> None:
        from throughline.projector.store import DuckProjection, LogRecord

        self._record = LogRecord
        self._dir = tempfile.TemporaryDirectory(prefix="throughline-oracle-")
        self._store = DuckProjection.open(Path(self._dir.name) / "oracle.duckdb", topic=self.TOPIC)
        self._store.fetching_from({PARTITION: 0})
        self.projection: Projection = self._store

    def apply(self, batch: list[tuple[bytes, bytes, int, int]]) -> None:
        records = [self._record(partition, offset, key, value) for key, value, partition, offset in batch]
        self._store.apply_batch(self.TOPIC, PARTITION, records)

    def fetch(self, batch: list[tuple[bytes, bytes, int, int]]) -> None:
        records = [self._record(partition, offset, key, value) for key, value, partition, offset in batch]
        if records:
            self._store.fetched([self._store.prepare(PARTITION, records)])

    def close(self) -> None:
        try:
            self._store.close()
        finally:
            self._dir.cleanup()


class StagedDuckTarget(DuckTarget):
    """The DuckDB projection as ``serve`` feeds it: each applied batch is staged for readers at once
    (``DuckProjection.stage``) and committed when the next batch is staged, so that every read sees the
    newest batch from a layer above the committed file (``throughline.core.layers``)."""

    def __init__(self) -> None:
        super().__init__()
        self._staged: list[Any] = []

    def apply(self, batch: list[tuple[bytes, bytes, int, int]]) -> None:
        records = [self._record(partition, offset, key, value) for key, value, partition, offset in batch]
        if not records:
            return
        from throughline.projector.store import stageable

        poll = [self._store.prepare(PARTITION, records)]
        for older in self._staged:
            self._store.apply_prepared(self.TOPIC, older)
        self._staged = []
        if stageable(poll) and self._store.stage(self.TOPIC, poll) is not None:
            self._staged.append(poll)
        else:  # a repair is committed alone, as the writer does
            self._store.apply_prepared(self.TOPIC, poll)


# ------------------------------------------------------------------------------------------- faults


@dataclass
class _DamagedView(PassThroughView):
    hidden: set[tuple[bytes, int]]
    altered: set[tuple[bytes, int]]

    def turns(self, source_sha256: bytes, first_seq: int, last_seq: int) -> list[StoredTurn]:
        return self._damaged(source_sha256, self.inner.turns(source_sha256, first_seq, last_seq))

    def turns_many(self, ranges: list[tuple[bytes, int, int]]) -> list[list[StoredTurn]]:
        # The production multi-range read (one statement on DuckDB), damaged range by range.
        read = self.inner.turns_many(ranges)
        return [self._damaged(source, rows) for (source, _, _), rows in zip(ranges, read, strict=True)]

    def _damaged(self, source_sha256: bytes, read: list[StoredTurn]) -> list[StoredTurn]:
        rows = []
        for row in read:
            if (source_sha256, row.seq) in self.hidden:
                continue
            if (source_sha256, row.seq) in self.altered:
                row = dataclasses.replace(row, body=row.body + "!", body_bytes=row.body_bytes + 1)
            rows.append(row)
        return rows


@dataclass
class DamagedProjection(PassThroughWaits):
    """A pass-through ``Projection`` that hides or garbles the turn rows named in ``hidden``/``altered``."""

    hidden: set[tuple[bytes, int]] = field(default_factory=set)
    altered: set[tuple[bytes, int]] = field(default_factory=set)

    @contextmanager
    def view(self) -> Iterator[ProjectionView]:
        with self.inner.view() as inner:
            yield _DamagedView(inner, self.hidden, self.altered)


# ------------------------------------------------------------------------------------------- series


@dataclass
class PageRead:
    """An ok page as first read: the token it was read with and its wire document."""

    token: str | None
    wire: dict[str, Any]


@dataclass
class Series:
    """One read series as the Observer drives it."""

    index: int
    project: str
    after: str | None
    through: str | None  # given at start, or pinned by the first ok page
    limit: int
    body_limit: int
    pages: list[PageRead] = field(default_factory=list)
    next_token: str | None = None
    complete: bool = False
    pin_end: int | None = None  # the log end when the through cursor was pinned

    def describe(self) -> str:
        return (
            f"series {self.index} ({self.project}, after={'yes' if self.after else 'none'}, "
            f"limit={self.limit}, page {len(self.pages)})"
        )


# ------------------------------------------------------------------------------------------- driver


Reader = Callable[..., Any]


@dataclass
class Driver:
    """Runs steps against production and the model side by side."""

    target: Target
    reader: Reader
    model: Model = field(default_factory=Model)
    log: list[tuple[bytes, bytes]] = field(default_factory=list)  # (key = project hash, Avro value)
    series: list[Series] = field(default_factory=list)
    saved: dict[str, list[str]] = field(default_factory=dict)  # project -> through cursors of completed series
    reads: int = 0
    stats: Counter[str] = field(default_factory=Counter)  # what the history exercised (Hypothesis events)
    order: list[int] = field(default_factory=list)  # the series of each ok page, in reading order
    order_mark: dict[int, int] = field(default_factory=dict)  # series -> index after its last ok page
    projection: DamagedProjection = field(init=False)

    def __post_init__(self) -> None:
        self.projection = DamagedProjection(self.target.projection)

    # ---------------------------------------------------------------------------------- production

    def call(self, **kwargs: Any) -> Outcome:
        """One production read. A throughline error becomes an error outcome; any other exception the
        reader raises becomes a crash outcome, which the checker rejects whatever the model expected
        (a crash is never a contract answer). Faults of the driver itself still propagate."""
        self.reads += 1
        logview = FixedLog(partitions=1, ends={PARTITION: len(self.log)})
        try:
            result = self.reader(projection=self.projection, log=logview, token_key=TOKEN_KEY, wait_timeout=0, **kwargs)
        except ThroughlineError as exc:
            return Outcome(error_code=exc.code, error_type=type(exc).__name__)
        except Exception as exc:  # a reader that crashes has not answered what the model expects
            return Outcome(error_type=f"{type(exc).__module__}.{type(exc).__name__}", crashed=True)
        return Outcome(
            wire=result.to_dict() if hasattr(result, "to_dict") else result.model_dump(mode="json", by_alias=True)
        )

    # ---------------------------------------------------------------------------------------- steps

    def run(self, steps: list[Step]) -> None:
        """Run every step, then finish the open series (so each series' laws are checked to the end)."""
        for number, step in enumerate(steps):
            self.step(number, step)
        self.drain(len(steps))

    def drain(self, number: int) -> None:
        """The end-of-history checkpoint: repair the projection, let the projector catch up, and read
        every open series to its end; a turn completes on the series' project (and is applied) after
        its first drained page, so every series still open here also sees the head move mid-series."""
        self.step(number, Repair())
        self.apply_records(None)
        for series in list(self.series):
            moved = False
            for _ in range(64):
                if series.complete or not self.next_page(number, series, final=True):
                    break
                if not moved and not series.complete:
                    moved = True
                    self.append(Append(PROJECTS.index(series.project), None, "completed while draining"))
                    self.apply_records(None)
        # Every token issued in the history, replayed out of its series in each of the three ways.
        for series in self.series:
            for variant in VARIANTS:
                self.replay(number, series, Replay(series.index, 0, variant), final=True)
        self.scoped_epilogue(number)

    def scoped_epilogue(self, number: int) -> None:
        """The last checkpoint of every history: the wait scoped to the project. A turn of each project
        completes and is fetched, not applied: each project's first page is pending (its own turn is in
        flight). Then the first of the two is applied: that project's first page must be ok although
        the other's turn is still in flight, and the other's still pending; each in both forms (a
        snapshot, and a delta from the first turn of the project's head source)."""
        counted, self.stats = self.stats, Counter()  # the epilogue's pages are counted apart
        for i in range(len(PROJECTS)):
            self.append(Append(i, None, "in flight"))
        self.step(number, Fetch(None))
        for applied in (False, True):
            if applied:
                self.apply_records(1)
            for i in range(len(PROJECTS)):
                for after in (None, Pick("prefix", 0, 0)):
                    self.start(number, Start(i, after, None, 10, 1 << 20))
        self.apply_records(None)
        epilogue, self.stats = self.stats, counted
        self.stats["epilogue: ok while the other project's turn is in flight"] += epilogue[
            "page ok while another project's records were not applied"
        ]
        self.stats["epilogue: pending while its own turn is in flight"] += epilogue["page projection_pending"]

    def step(self, number: int, step: Step) -> None:
        """Run one step."""
        if isinstance(step, Append | Rewind | Gap):
            self.append(step)
        elif isinstance(step, Mend):
            self.mend(step)
        elif isinstance(step, Apply):
            self.apply_records(step.count)
        elif isinstance(step, Fetch):
            first, end = self.model.fetch(step.count)
            self.target.fetch([(*self.log[o], PARTITION, o) for o in range(first, end)])
        elif isinstance(step, Start):
            self.start(number, step)
        elif isinstance(step, Damage):
            self.damage(step)
        elif isinstance(step, Repair):
            self.model.hidden.clear()
            self.model.altered.clear()
            self.projection.hidden.clear()
            self.projection.altered.clear()
        elif isinstance(step, Reread):
            # Series with a page to re-read (a first contact with an empty project has none).
            readable = [s for s in self.series if s.pages and s.through is not None]
            if readable:
                self.reread(number, readable[step.series % len(readable)], step.page)
        elif isinstance(step, Replay):
            holding = [s for s in self.series if any(p.wire["page"]["nextToken"] for p in s.pages)]
            if holding:
                self.replay(number, holding[step.series % len(holding)], step)
        else:
            open_series = [s for s in self.series if not s.complete]
            if open_series:
                self.next_page(number, open_series[step.series % len(open_series)])

    def append(self, step: Append | Rewind | Gap) -> None:
        project = PROJECTS[step.project]
        state = self.model.log_state
        if isinstance(step, Append):
            source = state.heads.get(project, SOURCES[0]) if step.source is None else SOURCES[step.source]
            seq = None
        elif isinstance(step, Gap):
            source = state.heads.get(project, SOURCES[0]) if step.source is None else SOURCES[step.source]
            seq = len(state.chain(project, source) or []) + 2 + step.skip % 3
            self.stats["a source broken by a gap"] += 1
        else:
            live = state.sources(project)
            if not live:
                return
            source = live[step.source % len(live)]
            length = len(state.chain(project, source) or [])
            seq = length - step.back % length
        record = self.model.append(project, source[0], source[1], seq, step.body)
        turn = build_turn(
            project=record.project,
            host=record.host,
            thread=record.thread,
            turn_id=record.turn_id,
            completed_at_micros=record.micros,
            body=record.body,
            seq=record.seq,
        )
        self.log.append((turn.project_sha256, encode_turn(turn)))

    def mend(self, step: Mend) -> None:
        """An operator's repair record: for a broken source of the project when there is one."""
        project = PROJECTS[step.project]
        state = self.model.log_state
        broken = [s for s in SOURCES if (project, *s) in state.broken]
        head = state.heads.get(project)
        if step.source is None and head in broken:
            source = head
        elif broken:
            source = broken[(step.source or 0) % len(broken)]
        else:
            source = SOURCES[(step.source or 0) % len(SOURCES)]
        record = self.model.append_repair(project, source[0], source[1], f"mended at step {len(self.log)}")
        repair = build_repair(project=record.project, host=record.host, thread=record.thread, reason=record.body)
        self.log.append((repair.project_sha256, encode_repair(repair)))
        self.stats["a repair record appended" + ("" if broken else " with nothing to repair")] += 1

    def apply_records(self, count: int | None) -> None:
        first = self.model.applied
        n = self.model.apply(count)
        if n:
            self.target.apply([(*self.log[o], PARTITION, o) for o in range(first, first + n)])

    def damage(self, step: Damage) -> None:
        project = PROJECTS[step.project]
        state = self.model.applied_state
        live = state.sources(project)
        if not live:
            return
        head = state.heads.get(project)
        source = head if step.source is None and head is not None else live[(step.source or 0) % len(live)]
        length = len(state.chain(project, source) or [])
        seq = length - step.back % length
        into_model = self.model.hidden if step.kind == "hide" else self.model.altered
        into_model.add((project, *source, seq))
        into_view = self.projection.hidden if step.kind == "hide" else self.projection.altered
        into_view.add((source_hash(project, *source), seq))

    def pick(self, project: str, pick: Pick | None) -> str | None:
        """Resolve a cursor choice to a cursor string the model knows."""
        if pick is None:
            return None
        if pick.kind == "saved" and self.saved.get(project):
            texts = self.saved[project]
            return texts[pick.n % len(texts)]
        owner = PROJECTS[(PROJECTS.index(project) + 1) % len(PROJECTS)] if pick.kind == "foreign" else project
        state = self.model.log_state
        live = state.sources(owner)
        if not live:
            return None
        if pick.kind == "pending":
            # A source's last record makes its tip, so the tip of a source with an unapplied record is unapplied.
            unapplied = {(r.host, r.thread) for r in self.model.records[self.model.applied :] if r.project == owner}
            live = [s for s in live if s in unapplied] or live
        elif pick.kind == "applied" and self.model.applied_state.sources(owner):
            state = self.model.applied_state
            live = state.sources(owner)
        source = live[pick.source % len(live)]
        length = len(state.chain(owner, source) or [])
        if pick.kind == "prefix":
            chosen = 1 + pick.n % length
        elif pick.kind == "pending":
            chosen = length  # the tip: made by the source's last record
        else:
            chosen = length - pick.n % length
        return self.model.register(self.model.prefix_of(state, owner, source, chosen))

    def start(self, number: int, step: Start) -> None:
        project = PROJECTS[step.project]
        series = Series(
            len(self.series),
            project,
            self.pick(project, step.after),
            self.pick(project, step.through),
            step.limit,
            step.body_limit,
        )
        if series.through is not None:
            series.pin_end = self.model.log_end
        self.series.append(series)
        self.next_page(number, series)

    # ---------------------------------------------------------------------------------------- reads

    def _offset(self, series: Series, page: int) -> int | None:
        return None if page == 0 else page * series.limit

    def next_page(self, number: int, series: Series, final: bool = False) -> bool:
        """Read the series' next page; True when it was ok."""
        page = len(series.pages)
        context = f"step #{number}{' (drain)' if final else ''}, {series.describe()}"
        expect = self.model.expect_read(
            series.project,
            series.after,
            series.through,
            self._offset(series, page),
            series.limit,
            series.body_limit,
        )
        token = series.next_token
        outcome = self.call(
            project=series.project,
            after_cursor=series.after,
            through_cursor=series.through,
            page_token=token,
            limit=series.limit,
            body_limit=series.body_limit,
        )
        snapshot = series.after is None
        pin_end = series.pin_end if series.through is not None else self.model.log_end
        checker.check_read(self.model, expect, outcome, context=context, snapshot=snapshot, pin_end=pin_end)
        self.stats[f"page {expect.error_code if expect.status == ERROR else expect.status}"] += 1
        if series.after is not None and series.through is not None:
            after, through = self.model.cursors[series.after], self.model.cursors[series.through]
            if (
                after.offset >= self.model.applied > through.offset
                and after.project == through.project == series.project
            ):
                self.stats["page whose after cursor's record is unapplied, its through cursor's applied"] += 1
        if expect.status == OK and expect.scoped:
            self.stats["page ok while another project's records were not applied"] += 1
        if expect.status == PENDING and "projection" in expect.reason:
            self.stats["page pending: the projection lacks or garbles a row"] += 1
        if expect.status != OK:
            return False
        assert outcome.wire is not None
        mended_at = None if expect.through is None else self.model.mended.get((series.project, *expect.through.source))
        if mended_at is not None and mended_at < self.model.applied:
            self.stats["page ok of a source a repair mended"] += 1
        if series.through is None:
            series.through = outcome.wire["throughCursor"]
            if series.through is None:
                self.stats["first contact with an empty project"] += 1
            series.pin_end = self.model.log_end
        series.pages.append(PageRead(token, outcome.wire))
        if any(
            self.order[i] != series.index
            for i in range(self.order_mark.get(series.index, len(self.order)), len(self.order))
        ):
            self.stats["pages of two series interleaved"] += 1
        self.order_mark[series.index] = len(self.order) + 1
        self.order.append(series.index)
        series.next_token = outcome.wire["page"]["nextToken"]
        series.complete = bool(outcome.wire["page"]["complete"])
        if series.complete and series.through is not None:
            expected = self.model.series_range(
                series.project, series.after, series.through, series.limit, series.body_limit
            )
            checker.check_series_complete([p.wire for p in series.pages], expected, context=context, snapshot=snapshot)
            self.saved.setdefault(series.project, []).append(series.through)
            kind = "snapshot" if series.after is None else "multi-page" if len(series.pages) > 1 else "one-page"
            self.stats[f"completed {kind} series"] += 1
            if (
                series.after is not None
                and self.model.cursors[series.after].source != self.model.cursors[series.through].source
            ):
                self.stats["completed host/thread switch series"] += 1
            if series.after is not None:  # the range law's boundaries (docs/spec.md#pagination)
                size = len(expected)
                edge = {0: "empty", series.limit: "exactly limit", series.limit + 1: "limit + 1"}.get(size)
                if edge:
                    self.stats[f"completed series with a range of {edge}"] += 1
            elif outcome.wire["historyTruncated"]:
                self.stats["completed snapshot with historyTruncated"] += 1
            if series.pin_end is not None and series.pin_end < self.model.log_end and len(series.pages) > 1:
                self.stats["turns completed during a multi-page series"] += 1
        return True

    def reread(self, number: int, series: Series, page: int) -> None:
        if not series.pages or series.through is None:
            return  # nothing read yet, or first contact with an empty project (there is no series to re-read)
        j = page % len(series.pages)
        first = series.pages[j]
        context = f"step #{number}, re-read page {j} of {series.describe()}"
        expect = self.model.expect_read(
            series.project,
            series.after,
            series.through,
            self._offset(series, j),
            series.limit,
            series.body_limit,
        )
        outcome = self.call(
            project=series.project,
            after_cursor=series.after,
            through_cursor=series.through,
            page_token=first.token,
            limit=series.limit,
            body_limit=series.body_limit,
        )
        checker.check_read(
            self.model, expect, outcome, context=context, snapshot=series.after is None, pin_end=series.pin_end
        )
        checker.check_reread(first.wire, outcome, expect, context=context)
        self.stats[f"re-read {expect.status}"] += 1

    def replay(self, number: int, series: Series, step: Replay, final: bool = False) -> None:
        tokens = [p.wire["page"]["nextToken"] for p in series.pages if p.wire["page"]["nextToken"]]
        if not tokens or series.through is None:
            return
        token = tokens[step.page % len(tokens)]
        project, after, through = series.project, series.after, series.through
        if step.variant == "project":
            project = PROJECTS[(PROJECTS.index(project) + 1) % len(PROJECTS)]
        elif step.variant == "after":
            after = None if after is not None else self.model.register(self.model.forged(self.model.cursors[through]))
        else:
            through = self.model.register(self.model.forged(self.model.cursors[through]))
        context = (
            f"step #{number}{' (drain)' if final else ''}, token replayed with another {step.variant}, "
            f"{series.describe()}"
        )
        outcome = self.call(
            project=project,
            after_cursor=after,
            through_cursor=through,
            page_token=token,
            limit=series.limit,
            body_limit=series.body_limit,
        )
        checker.check_token_replay(outcome, context=context)
        self.stats[f"token replayed with another {step.variant}"] += 1


def run_history(
    steps: list[Step], *, reader: Reader | None = None, target: Callable[[], Target] | None = None
) -> Driver:
    """Run ``steps`` on a fresh target (DuckDB when available) with ``reader`` (production by default)."""
    factory = target or duck_target_factory() or BookTarget
    made = factory()
    try:
        driver = Driver(made, reader or production_reader())
        driver.run(steps)
        return driver
    finally:
        made.close()
