"""Generated turn histories for the fold, the DuckDB projection and the projection contract tests.

A history is a list of ``TurnRecord``s over a few projects, hosts and threads, with seqs that append,
rewind and leave gaps, and turn ids drawn from a small pool (so retries, duplicates and conflicting
re-uses of an id happen often). ``to_log`` places them on partitions the way producers do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import strategies as st

from throughline.core.fold import ChainBook
from throughline.core.partitioning import partition_for
from throughline.core.turn import TurnRecord, build_turn
from throughline.projector.store import LogRecord
from throughline.schemas.codec import encode_turn

PROJECTS = ("/work/alpha", "/work/beta", "gamma")
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
    """One valid turn record."""
    return build_turn(
        project=project, host=host, thread=thread, turn_id=turn_id, completed_at_micros=at, body=body, seq=seq
    )


@st.composite
def histories(draw: st.DrawFn, max_size: int = 40, projects: Sequence[str] = PROJECTS) -> list[TurnRecord]:
    """A history of turn records (appends, rewinds, gaps, retries, conflicting ids)."""
    size = draw(st.integers(0, max_size))
    out: list[TurnRecord] = []
    for i in range(size):
        if out and draw(st.integers(0, 9)) == 0:  # a retried append: the very same record again
            out.append(out[draw(st.integers(0, len(out) - 1))])
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


def by_partition(records: Sequence[LogRecord]) -> dict[int, list[LogRecord]]:
    """Log records grouped by partition, in offset order."""
    out: dict[int, list[LogRecord]] = {}
    for r in records:
        out.setdefault(r.partition, []).append(r)
    return out
