"""The main process's side of the fetch worker's pipe: every frame already written is taken as one poll.

Under steady ingest the worker sends a frame whenever a few records arrive; one transaction a frame
could not keep up (each commit costs milliseconds whatever its size), and the frames queued in the
pipe for seconds. ``WorkerFeed.next`` therefore merges the frames waiting in the pipe (up to
``max_poll_records``) and keeps an error for the next call. A stand-in worker (a process that only
reads its spec) lets the test write the frames itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import BinaryIO

import pytest
from hypothesis import given
from hypothesis import strategies as st

from throughline.projector.feed import FeedSpec, FetchWorkerError, ProjectorOptions, WorkerFeed, WorkerProcess
from throughline.projector.feed.frames import frame_bytes
from throughline.projector.prepare import InvalidBatchError, PreparedBatch, RefusedRecord, merge_polls, split_poll


def _batch(partition: int, offsets: list[int], next_offset: int | None = None) -> PreparedBatch:
    items = tuple(RefusedRecord(o, None, None, "record_undecodable", f"#{o}") for o in offsets)
    return PreparedBatch(partition, items, next_offset if next_offset is not None else offsets[-1] + 1)


def _offsets(batches: list[PreparedBatch]) -> dict[int, tuple[list[int], int]]:
    return {b.partition: ([it.offset for it in b.items], b.next_offset) for b in batches}


@pytest.fixture
def fake() -> Iterator[tuple[WorkerFeed, BinaryIO]]:
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.buffer.read()"], stdin=subprocess.PIPE)
    spec = FeedSpec(("127.0.0.1:9",), "frames", 2, (), ProjectorOptions(max_poll_records=5)).at({})
    feed = WorkerFeed(spec, WorkerProcess(proc, read_fd))
    out = os.fdopen(write_fd, "wb")
    try:
        yield feed, out
    finally:
        out.close()
        feed.close()


def _send(out: BinaryIO, kind: str, payload: object) -> None:
    out.write(frame_bytes(kind, payload))
    out.flush()


def test_the_frames_waiting_in_the_pipe_come_as_one_poll(fake: tuple[WorkerFeed, BinaryIO]) -> None:
    feed, out = fake
    _send(out, "batches", [_batch(0, [0])])
    _send(out, "batches", [_batch(0, [1]), _batch(1, [0])])
    _send(out, "batches", [_batch(0, [], next_offset=4)])  # the position passed a transaction marker
    assert _offsets(feed.next(5.0)) == {0: ([0, 1], 4), 1: ([0], 1)}
    assert feed.next(0.05) == []


def test_a_poll_holds_at_most_max_poll_records(fake: tuple[WorkerFeed, BinaryIO]) -> None:
    feed, out = fake
    for first in (0, 2, 4):
        _send(out, "batches", [_batch(1, [first, first + 1])])
    assert _offsets(feed.next(5.0)) == {1: ([0, 1, 2, 3], 4)}  # a third frame would make 6 > 5
    assert _offsets(feed.next(5.0)) == {1: ([4, 5], 6)}


def test_an_error_after_batches_comes_on_the_next_call(fake: tuple[WorkerFeed, BinaryIO]) -> None:
    feed, out = fake
    _send(out, "batches", [_batch(0, [0])])
    _send(out, "error", FetchWorkerError("the fetch worker failed: broker gone"))
    assert _offsets(feed.next(5.0)) == {0: ([0], 1)}
    with pytest.raises(FetchWorkerError, match="broker gone"):
        feed.next(5.0)


def test_a_worker_that_dies_after_a_frame_is_reported_after_it(fake: tuple[WorkerFeed, BinaryIO]) -> None:
    feed, out = fake
    _send(out, "batches", [_batch(0, [0, 1])])
    out.close()  # the worker's end of the pipe: EOF
    assert _offsets(feed.next(5.0)) == {0: ([0, 1], 2)}
    with pytest.raises(FetchWorkerError, match="exited"):
        feed.next(5.0)


@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(0, 2)), max_size=3), min_size=1, max_size=5
    )
)
def test_merged_polls_are_the_poll_that_holds_them_all(polls_spec: list[list[tuple[int, int, int]]]) -> None:
    """Consecutive polls (records and skipped offsets per partition) merge into what one poll would hold."""
    ends = {0: 0, 1: 0, 2: 0}
    polls: list[list[PreparedBatch]] = []
    expected: dict[int, tuple[list[int], int]] = {}
    for spec in polls_spec:
        poll = []
        for partition, count, skipped in {p: (p, c, s) for p, c, s in spec}.values():
            offsets = list(range(ends[partition], ends[partition] + count))
            end = ends[partition] + count + skipped
            poll.append(_batch(partition, offsets, end))
            ends[partition] = end
            before, _ = expected.get(partition, ([], 0))
            expected[partition] = (before + offsets, end)
        polls.append(poll)
    merged = merge_polls(polls)
    assert _offsets(merged) == expected
    assert len({b.partition for b in merged}) == len(merged)


@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 12), st.integers(0, 2)), max_size=3),
    st.integers(1, 5),
)
def test_a_split_poll_is_consecutive_polls_of_at_most_so_many_records(
    spec: list[tuple[int, int, int]], most: int
) -> None:
    """What a feed with a smaller ``max_poll_records`` would have delivered: merged back, the same poll."""
    poll = []
    for partition, count, skipped in {p: (p, c, s) for p, c, s in spec}.values():
        offsets = list(range(10, 10 + 2 * count, 2))  # every other offset holds no record
        poll.append(_batch(partition, offsets, 10 + 2 * count + skipped))
    parts = split_poll(poll, most)
    assert all(sum(len(b.items) for b in part) <= most for part in parts)
    assert all(len({b.partition for b in part}) == len(part) for part in parts)  # each part a poll
    assert _offsets(merge_polls(parts)) == _offsets(poll) if parts else poll == []
    pieces = [b for part in parts for b in part]
    for before, after in zip(pieces, pieces[1:], strict=False):  # one partition's pieces follow each other
        if before.partition == after.partition:
            assert before.next_offset == after.items[0].offset
    for part, following in zip(parts, parts[1:], strict=False):  # packed: the next piece did not fit
        first = following[0]
        assert sum(len(b.items) for b in part) + len(first.items) > most or any(
            b.partition == first.partition for b in part
        )


def test_polls_out_of_order_are_refused() -> None:
    with pytest.raises(InvalidBatchError):
        merge_polls([[_batch(0, [3, 4])], [_batch(0, [2])]])
