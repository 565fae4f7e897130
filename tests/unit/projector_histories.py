"""Generated turn histories for the fold, the DuckDB projection and the projection contract tests.

A history is a list of ``TurnRecord``s over a few projects, hosts and threads, with seqs that append,
rewind and leave gaps, and turn ids drawn from a small pool (so retries, duplicates and conflicting
re-uses of an id happen often), and turns re-sent as a newer parser reads them (the same turn id with
other content and/or another seq). ``to_log`` places them on partitions the way producers do. ``logs``
puts repair records in between (``Entry``, ``entries_log``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st
from support.world import make_turn

from throughline.core.fold import ChainBook
from throughline.core.identity import project_sha256, source_sha256
from throughline.core.partitioning import partition_for
from throughline.core.repair import RepairRecord, build_repair
from throughline.core.turn import TurnRecord
from throughline.projector.store import DuckProjection, LogRecord
from throughline.schemas.codec import encode_repair, encode_turn

PROJECTS = ("/work/alpha", "/work/beta", "gamma")
#: The topic the projections of these histories are bound to (the ``db`` fixture of conftest.py).
TOPIC = "turns"
HOSTS = ("host-a", "host-b")
THREADS = ("main", "side")
BODIES = ("", "hello", "a longer body\nwith lines", "ünïcödé ✓")


def turn(
    project: str = PROJECTS[0],
    host: str = HOSTS[0],
    thread: str = THREADS[0],
    turn_id: str = "u0",
    *,
    seq: int | None = None,
    body: str = "hello",
    at: int = 1_700_000_000_000_000,
) -> TurnRecord:
    """One valid turn record (``support.world.make_turn`` with this module's defaults)."""
    return make_turn(project, host, thread, turn_id, at=at, body=body, seq=seq)


@st.composite
def histories(draw: st.DrawFn, max_size: int = 40, projects: Sequence[str] = PROJECTS) -> list[TurnRecord]:
    """A history of turn records (appends, rewinds, gaps, retries, conflicting ids)."""
    size = draw(st.integers(0, max_size))
    out: list[TurnRecord] = []
    for i in range(size):
        if out and draw(st.integers(0, 9)) == 0:  # a retried append: the very same record again
            out.append(out[draw(st.integers(0, len(out) - 1))])
            continue
        if out and draw(st.integers(0, 7)) == 0:
            # A turn sent again as a newer parser reads it: other content (a fuller reply, another
            # completedAt) and/or another seq (a turn found or dropped before it), or no seq.
            old = out[draw(st.integers(0, len(out) - 1))]
            shift = draw(st.sampled_from([-2, -1, 0, 0, 1, 2]))
            again_seq = None if old.seq is None else max(1, old.seq + shift)
            out.append(
                turn(
                    old.project,
                    old.host,
                    old.thread,
                    old.turn_id,
                    seq=draw(st.sampled_from([again_seq, again_seq, None])),
                    body=draw(st.sampled_from([old.body, old.body + " (the whole reply)", *BODIES])),
                    at=old.completed_at_micros + draw(st.sampled_from([0, 0, 1])),
                )
            )
            continue
        seq = draw(st.one_of(st.none(), st.none(), st.integers(1, 7)))
        out.append(
            turn(
                draw(st.sampled_from(projects)),
                draw(st.sampled_from(HOSTS)),
                draw(st.sampled_from(THREADS)),
                draw(st.sampled_from([f"u{k}" for k in range(10)] + [f"fresh{i}"] * 6)),
                seq=seq,
                body=draw(st.sampled_from(BODIES)),
                at=1_700_000_000_000_000 + draw(st.integers(0, 2)),
            )
        )
    return out


@dataclass(frozen=True)
class Placed:
    """A record where the log put it."""

    record: TurnRecord
    partition: int
    offset: int


def place(records: Sequence[TurnRecord], partitions: int = 1) -> list[Placed]:
    """Put records on partitions by project (as producers do), with consecutive offsets per partition."""
    next_offset = [0] * partitions
    out: list[Placed] = []
    for r in records:
        p = partition_for(r.project_sha256, partitions)
        out.append(Placed(r, p, next_offset[p]))
        next_offset[p] += 1
    return out


def to_log(placed: Sequence[Placed]) -> list[LogRecord]:
    """The log records (key = project hash, Avro value) of placed turns."""
    return [LogRecord(p.partition, p.offset, p.record.project_sha256, encode_turn(p.record)) for p in placed]


def book_of(placed: Sequence[Placed]) -> ChainBook:
    """The reference fold of placed turns."""
    book = ChainBook()
    for p in placed:
        book.apply(p.record, p.partition, p.offset, p.record.project_sha256)
    return book


@contextmanager
def one_and_many(source_cache: int) -> Iterator[tuple[DuckProjection, DuckProjection]]:
    """Two new projections in a temporary folder, closed after: ``one``, which a test gives each
    partition's records in one batch (``apply_whole``), and ``many``, with a cache of ``source_cache``
    sources, which it gives the same records cut into other batches."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        DuckProjection.open(Path(tmp) / "one.duckdb", topic=TOPIC) as one,
        DuckProjection.open(Path(tmp) / "many.duckdb", topic=TOPIC, source_cache=source_cache) as many,
    ):
        yield one, many


def apply_whole(projection: DuckProjection, log: Sequence[LogRecord]) -> None:
    """Apply each partition's records of ``log`` to ``projection`` in one batch."""
    for partition, recs in by_partition(log).items():
        projection.apply_batch(TOPIC, partition, recs)


def by_partition(records: Sequence[LogRecord]) -> dict[int, list[LogRecord]]:
    """Log records grouped by partition, in offset order."""
    out: dict[int, list[LogRecord]] = {}
    for r in records:
        out.setdefault(r.partition, []).append(r)
    return out


# ------------------------------------------------------------------------------- with repairs

PARTITIONS = 2
TWO_PROJECTS = PROJECTS[:2]


@dataclass(frozen=True)
class Entry:
    """One record of a generated log: where it is, its key, and the decoded record."""

    record: TurnRecord | RepairRecord
    partition: int
    offset: int
    key: bytes


@st.composite
def repairs(draw: st.DrawFn, turns: list[TurnRecord]) -> RepairRecord:
    """A repair: mostly of a source the history has, else of an unknown one or another project's."""
    kind = draw(st.sampled_from(["known"] * 6 + ["unknown", "foreign"]))
    project = draw(st.sampled_from(TWO_PROJECTS))
    if kind == "known" and turns:
        t = draw(st.sampled_from(turns))
        return build_repair(project=t.project, host=t.host, thread=t.thread, reason="accepted")
    if kind == "foreign":
        other = TWO_PROJECTS[1 - TWO_PROJECTS.index(project)]
        source = source_sha256(project_sha256(other), draw(st.sampled_from(HOSTS)), draw(st.sampled_from(THREADS)))
        return build_repair(project=project, source=source, reason="wrong project")
    return build_repair(project=project, host="nobody", thread=draw(st.sampled_from(THREADS)), reason="typo")


@st.composite
def logs(draw: st.DrawFn, poison: bool = True) -> list[Entry]:
    """Turns and repairs placed on partitions by project, with consecutive offsets per partition."""
    turns = draw(histories(max_size=30, projects=TWO_PROJECTS))
    records: list[TurnRecord | RepairRecord] = list(turns)
    for _ in range(draw(st.integers(0, 6))):
        records.insert(draw(st.integers(0, len(records))), draw(repairs(turns)))
    next_offset = [0] * PARTITIONS
    out: list[Entry] = []
    for r in records:
        key = r.project_sha256
        if poison and isinstance(r, RepairRecord) and draw(st.integers(0, 7)) == 0:
            if draw(st.booleans()):
                key = project_sha256("/somewhere/else")  # quarantined: project and key disagree
            else:
                r = RepairRecord(r.project_sha256, r.source_sha256, "")  # quarantined: no reason
        p = partition_for(r.project_sha256, PARTITIONS)
        out.append(Entry(r, p, next_offset[p], key))
        next_offset[p] += 1
    return out


def entries_log(entries: Sequence[Entry]) -> list[LogRecord]:
    """The log records of generated entries (turns and repairs, each under its entry's key)."""
    return [
        LogRecord(
            e.partition,
            e.offset,
            e.key,
            encode_repair(e.record) if isinstance(e.record, RepairRecord) else encode_turn(e.record),
        )
        for e in entries
    ]
