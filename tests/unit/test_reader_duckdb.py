"""The reader over the real DuckDB projection (its Kafka-free batch path), against the in-memory one.

No broker: records are encoded with the real codec and applied with ``DuckProjection.apply_batch``.
Every read is made twice, over ``BookProjection`` and over ``DuckProjection``, and must be identical.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reader_world import KEY, PROJECT, World

from throughline.projector.store import DuckProjection, LogRecord
from throughline.reader import ObserverRead, read_observer_turn_page
from throughline.schemas.codec import encode_turn

TOPIC = "turns-test"


class Twin(World):
    """A ``World`` whose projections are a ``BookProjection`` and a DuckDB file, fed the same records."""

    def __init__(self, path: Path, partitions: int = 1) -> None:
        super().__init__(partitions=partitions)
        self.duck = DuckProjection.open(path, topic=TOPIC)

    def project(self) -> None:
        by_partition: dict[int, list[LogRecord]] = {}
        for record, partition, offset in self.unprojected:
            by_partition.setdefault(partition, []).append(
                LogRecord(partition, offset, record.project_sha256, encode_turn(record))
            )
        for partition, records in by_partition.items():
            self.duck.apply_batch(TOPIC, partition, records)
        super().project()

    def both(self, **kwargs: Any) -> ObserverRead:
        """Read over both projections; they must agree exactly (reason included)."""
        kwargs.setdefault("wait_timeout", 0.0)
        book = read_observer_turn_page(
            project=PROJECT, projection=self.projection, log=self.log, token_key=KEY, **kwargs
        )
        duck = read_observer_turn_page(project=PROJECT, projection=self.duck, log=self.log, token_key=KEY, **kwargs)
        assert duck == book
        assert duck.reason == book.reason
        return duck

    def read(self, project: str = PROJECT, **kwargs: Any) -> ObserverRead:
        assert project == PROJECT
        return self.both(**kwargs)


@pytest.fixture
def twin(tmp_path: Path) -> Any:
    t = Twin(tmp_path / "p.duckdb")
    yield t
    t.duck.close()


def test_snapshot_delta_and_pagination(twin: Twin) -> None:
    twin.append_many(12)
    snap = twin.read(limit=5)
    assert [t.seq for t in snap.turns] == list(range(8, 13)) and snap.historyTruncated
    twin.append_many(23)
    pages = twin.series(after=snap.throughCursor, limit=10, between_pages=lambda: twin.append_many(2))
    assert [t.seq for p in pages for t in p.turns] == list(range(13, 36))


def test_rollback_switch_and_pending(twin: Twin) -> None:
    twin.append_many(6)
    after = twin.read().throughCursor
    twin.append(seq=3)
    assert twin.read(after_cursor=after).status == "resync_required"
    after = twin.read().throughCursor
    twin.append_many(4, thread="thread-new")
    assert [t.seq for t in twin.read(after_cursor=after).turns] == [1, 2, 3, 4]
    twin.append(apply=False)
    read = twin.read()
    assert read.status == "projection_pending" and read.throughCursor is None
    twin.project()
    assert twin.read().status == "ok"


def test_quarantined_source_is_refused_by_both(twin: Twin) -> None:
    twin.append_many(2)
    twin.append(seq=7)
    for projection in (twin.projection, twin.duck):
        with pytest.raises(Exception) as info:
            read_observer_turn_page(project=PROJECT, projection=projection, log=twin.log, token_key=KEY, wait_timeout=0)
        assert getattr(info.value, "code", None) == "source_quarantined"


def test_a_read_only_handle_answers_the_same(twin: Twin, tmp_path: Path) -> None:
    twin.append_many(15)
    expected = twin.read(limit=4)
    twin.duck.close()
    with DuckProjection.open(tmp_path / "p.duckdb", read_only=True, topic=TOPIC) as ro:
        read = read_observer_turn_page(project=PROJECT, projection=ro, log=twin.log, token_key=KEY, limit=4)
    assert read == expected
    twin.duck = DuckProjection.open(tmp_path / "p.duckdb", topic=TOPIC)


op = st.one_of(
    st.tuples(st.just("append"), st.sampled_from(["t1", "t2"]), st.integers(1, 12)),
    st.tuples(st.just("rewind"), st.sampled_from(["t1", "t2"]), st.floats(0, 1)),
    st.tuples(st.just("lag"), st.integers(1, 3)),
    st.tuples(st.just("series"), st.integers(1, 6)),
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=1, max_size=14))
def test_duckdb_and_memory_readers_agree_on_any_history(ops: list[tuple]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        twin = Twin(Path(tmp) / "p.duckdb")
        lengths: dict[str, int] = {}
        after: str | None = None
        try:
            for o in ops:
                if o[0] == "append":
                    for _ in range(o[2]):
                        twin.append(thread=o[1])
                    lengths[o[1]] = lengths.get(o[1], 0) + o[2]
                elif o[0] == "rewind" and lengths.get(o[1]):
                    seq = max(1, round(lengths[o[1]] * o[2]))
                    twin.append(thread=o[1], seq=seq)
                    lengths[o[1]] = seq
                elif o[0] == "lag":
                    for _ in range(o[1]):
                        twin.append(thread="t1", apply=False)
                    lengths["t1"] = lengths.get("t1", 0) + o[1]
                elif o[0] == "series":
                    pages = twin.series(after=after, limit=o[1])  # every page is read over both
                    if pages[-1].ok and pages[0].throughCursor is not None:
                        after = pages[0].throughCursor
                    elif pages[-1].status == "resync_required":
                        after = None
                    twin.project()
        finally:
            twin.duck.close()
