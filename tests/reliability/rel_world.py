"""A fixed history with secret names, in memory and in a real DuckDB file (not a test module).

The project path, hosts, threads and turn ids all carry a marker (``SECRET_MARKERS``) that must never
appear in a cursor, a page token, a wire document, a reason or an error message. The history has
every shape the reader serves: a long thread with a rollback, a thread switch, a host switch, a source
with a quarantined record (a gap), another project, multi-byte text and a body above the body bound.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from support.world import append_to_log, numbered_turn

from throughline.core.cursor import Cursor
from throughline.core.fold import BookTurn
from throughline.core.identity import project_sha256
from throughline.core.memory import BookProjection, FixedLog
from throughline.core.ports import cursor_of
from throughline.core.turn import TurnRecord
from throughline.projector.store import DuckProjection, LogRecord
from throughline.reader import read_observer_turn_page
from throughline.schemas.codec import encode_turn

KEY = bytes(range(7, 39))
TOPIC = "reliability-fuzz"
PROJECT = "/home/SECRETUSER/work/SECRETPATH-ledger αβ"
OTHER_PROJECT = "/srv/SECRETPATH2/other"
HOSTS = ("SECRETHOST-alpha", "SECRETHOST-beta")
THREADS = ("SECRETTHREAD-main", "SECRETTHREAD-side")
#: Substrings of raw identities that must never leave the system.
SECRET_MARKERS = ("SECRETUSER", "SECRETPATH", "SECRETHOST", "SECRETTHREAD", "SECRETTURN")
PARTITIONS = 3


@dataclass
class FixedWorld:
    """The history applied to a ``BookProjection`` (and optionally a DuckDB file), with cursor pools."""

    records: list[tuple[TurnRecord, int, int]] = field(default_factory=list)
    projection: BookProjection = field(default_factory=BookProjection)
    log: FixedLog = field(default_factory=lambda: FixedLog(PARTITIONS))
    counter: int = 0

    def add(self, project: str, host: str, thread: str, *, seq: int | None = None, body: str | None = None) -> None:
        self.counter += 1
        n = self.counter
        body = body if body is not None else f"turn {n}: naïve ✓ 中文 {'é' * (n % 5)}"
        record = numbered_turn(n, project, host, thread, body=body, id_prefix="SECRETTURN-", seq=seq)
        partition, offset = append_to_log(self.log, record)
        self.records.append((record, partition, offset))
        self.projection.apply(record, partition, offset)

    # -- pools

    def sources(self) -> dict[bytes, bytes]:
        """source hash -> project hash, for every source the history has."""
        return {r.source_sha256: r.project_sha256 for r, _, _ in self.records}

    def all_cursors(self) -> list[str]:
        """A cursor for every live prefix of every source, and for every superseded prefix."""
        book = self.projection.book
        projects = self.sources()
        out: list[str] = []
        for source, turns in book.live.items():
            out.extend(cursor_of(projects[source], source, t).encode() for t in turns)
        for turn in book.superseded:
            out.append(_cursor(turn, projects).encode())
        return out

    def head(self, project: str = PROJECT) -> str:
        with self.projection.view() as view:
            cursor = view.head(project_sha256(project))
        assert cursor is not None
        return cursor.encode()

    def tokens(self) -> list[tuple[str, str | None, str, int]]:
        """(token, after, through, limit) of every page of some paginated series of PROJECT."""
        out = []
        book = self.projection.book
        project = project_sha256(PROJECT)
        usable = [
            c
            for c in self.all_cursors()
            if _decoded(c).project_sha256 == project and _decoded(c).source_sha256 not in book.broken
        ]
        for after in usable[:: max(1, len(usable) // 8)]:
            for limit in (1, 2, 3):
                first = read_observer_turn_page(
                    project=PROJECT,
                    after_cursor=after,
                    limit=limit,
                    projection=self.projection,
                    log=self.log,
                    token_key=KEY,
                    wait_timeout=0.0,
                )
                page = first
                for _ in range(50):
                    if not page.ok or page.page.complete or page.throughCursor is None:
                        break
                    assert page.page.nextToken is not None
                    out.append((page.page.nextToken, after, page.throughCursor, limit))
                    page = read_observer_turn_page(
                        project=PROJECT,
                        after_cursor=after,
                        through_cursor=page.throughCursor,
                        page_token=page.page.nextToken,
                        limit=limit,
                        projection=self.projection,
                        log=self.log,
                        token_key=KEY,
                        wait_timeout=0.0,
                    )
        return out

    def log_records(self) -> Iterator[tuple[int, list[LogRecord]]]:
        by_partition: dict[int, list[LogRecord]] = {}
        for record, partition, offset in self.records:
            by_partition.setdefault(partition, []).append(
                LogRecord(partition, offset, record.project_sha256, encode_turn(record))
            )
        yield from sorted(by_partition.items())

    def duck(self, path: Path) -> DuckProjection:
        """The same history applied to a new DuckDB projection file (the Kafka-free batch path)."""
        projection = DuckProjection.open(path, topic=TOPIC)
        for partition, batch in self.log_records():
            projection.apply_batch(TOPIC, partition, batch)
        return projection

    @contextmanager
    def temporary_duck(self, name: str) -> Iterator[DuckProjection]:
        """``duck`` in a temporary folder, closed and removed afterwards."""
        with tempfile.TemporaryDirectory(prefix=f"tl-{name}-") as folder:
            projection = self.duck(Path(folder) / f"{name}.duckdb")
            try:
                yield projection
            finally:
                projection.close()


def _decoded(text: str) -> Cursor:
    from throughline.core.cursor import decode_cursor

    cursor = decode_cursor(text)
    assert isinstance(cursor, Cursor)
    return cursor


def _cursor(turn: BookTurn, projects: dict[bytes, bytes]) -> Cursor:
    source = turn.record.source_sha256
    return Cursor(projects[source], source, turn.seq, turn.chain_digest, turn.partition, turn.offset)


def build_world() -> FixedWorld:
    """The fixed history (deterministic)."""
    w = FixedWorld()
    a, b = HOSTS
    main, side = THREADS
    # A source that is broken early: a gap quarantines its third record.
    w.add(PROJECT, b, side)
    w.add(PROJECT, b, side)
    w.add(PROJECT, b, side, seq=5)
    # The long thread, with a rollback to seq 6 and a re-extension.
    for _ in range(9):
        w.add(PROJECT, a, main)
    w.add(PROJECT, a, main, seq=6, body="rolled back and replaced ✓")
    w.add(PROJECT, a, main)
    # A thread switch, a host switch, a huge body, and back to the long thread.
    for _ in range(4):
        w.add(PROJECT, a, side)
    w.add(PROJECT, b, main, body="ü" * 40_000)  # 80 KB: above the 64 KiB default body bound
    w.add(PROJECT, b, main)
    for _ in range(5):
        w.add(PROJECT, a, main)
    # Another project (maybe another partition).
    for _ in range(4):
        w.add(OTHER_PROJECT, a, main)
    return w
