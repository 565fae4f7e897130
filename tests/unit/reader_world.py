"""A small in-memory world for reader tests: a ``BookProjection``, a ``FixedLog`` and an appender.

Not a test module: imported by ``test_reader_*.py`` and ``test_observer.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from support.projection import PassThroughView, PassThroughWaits
from support.world import append_to_log, numbered_turn

from throughline.core.identity import project_sha256
from throughline.core.memory import BookProjection, FixedLog
from throughline.core.ports import ProjectionView, StoredTurn
from throughline.core.turn import TurnRecord
from throughline.reader import ObserverRead, read_observer_turn_page

KEY = bytes(range(100, 132))
PROJECT = "/home/alice/projects/ledger-secret"
OTHER_PROJECT = "/home/bob/other-thing"


@dataclass
class World:
    """A log and a projection the test drives by hand; ``append`` writes to the log, ``project`` applies."""

    partitions: int = 1
    projection: BookProjection = field(default_factory=BookProjection)
    log: FixedLog = field(init=False)
    unprojected: list[tuple[TurnRecord, int, int]] = field(default_factory=list)
    counter: int = 0

    def __post_init__(self) -> None:
        self.log = FixedLog(self.partitions)

    def append(
        self,
        project: str = PROJECT,
        host: str = "host-alpha",
        thread: str = "thread-main",
        *,
        body: str | None = None,
        seq: int | None = None,
        apply: bool = True,
    ) -> TurnRecord:
        """Append one turn to the log (and project it unless ``apply=False``)."""
        self.counter += 1
        body = body if body is not None else f"body text number {self.counter}"
        record = numbered_turn(self.counter, project, host, thread, body=body, seq=seq)
        partition, offset = append_to_log(self.log, record)
        self.unprojected.append((record, partition, offset))
        if apply:
            self.project()
        return record

    def append_many(self, n: int, **kwargs: Any) -> list[TurnRecord]:
        """Append ``n`` turns."""
        return [self.append(**kwargs) for _ in range(n)]

    def project(self) -> None:
        """Apply everything appended so far, in log order."""
        for record, partition, offset in self.unprojected:
            self.projection.apply(record, partition, offset)
        self.unprojected.clear()

    def read(self, project: str = PROJECT, **kwargs: Any) -> ObserverRead:
        """One page, with the world's handles and a zero wait."""
        kwargs.setdefault("wait_timeout", 0.0)
        kwargs.setdefault("projection", self.projection)
        kwargs.setdefault("log", self.log)
        kwargs.setdefault("token_key", KEY)
        return read_observer_turn_page(project=project, **kwargs)

    def series(
        self,
        project: str = PROJECT,
        *,
        after: str | None = None,
        limit: int = 10,
        between_pages: Callable[[], None] | None = None,
        **kwargs: Any,
    ) -> list[ObserverRead]:
        """Read a whole series, calling ``between_pages`` after each page; bounded in pages."""
        pages = [self.read(project, after_cursor=after, limit=limit, **kwargs)]
        for _ in range(10_000):
            last = pages[-1]
            if not last.ok or last.page.complete:
                return pages
            if between_pages is not None:
                between_pages()
            pages.append(
                self.read(
                    project,
                    after_cursor=after,
                    through_cursor=last.throughCursor,
                    page_token=last.page.nextToken,
                    limit=limit,
                    **kwargs,
                )
            )
        raise AssertionError("series did not complete")

    @property
    def project_hash(self) -> bytes:
        """SHA-256 of the default project."""
        return project_sha256(PROJECT)


def seqs(pages: list[ObserverRead]) -> list[int]:
    """Every seq a series served, in order."""
    return [t.seq for page in pages for t in page.turns]


@dataclass
class DoctoredProjection(PassThroughWaits):
    """A projection whose views pass every stored turn through ``doctor`` (``None`` drops the row)."""

    doctor: Callable[[StoredTurn], StoredTurn | None]

    def view(self) -> AbstractContextManager[ProjectionView]:
        """A doctored snapshot."""
        return self._view()

    @contextmanager
    def _view(self) -> Iterator[ProjectionView]:
        with self.inner.view() as view:
            yield _DoctoredView(view, self.doctor)


@dataclass
class _DoctoredView(PassThroughView):
    doctor: Callable[[StoredTurn], StoredTurn | None]

    def turns(self, source_sha256: bytes, first_seq: int, last_seq: int) -> list[StoredTurn]:
        out = []
        for row in self.inner.turns(source_sha256, first_seq, last_seq):
            doctored = self.doctor(row)
            if doctored is not None:
                out.append(doctored)
        return out


def replace(row: StoredTurn, **changes: Any) -> StoredTurn:
    """A changed copy of a stored turn."""
    return dataclasses.replace(row, **changes)
