"""A group member's partial load of a peer's projection snapshot, without a broker
(``projector/store/cut_files.py`` ``load_cut_partitions``, ``DuckProjection.load_cut_partitions``,
``projector/member_boot.py``): a snapshot's partitions land in a file that holds other partitions, which
stay untouched; the file then catches up from the snapshot's offsets into exactly the full projection;
readers and waiters see the loaded offsets at once; a file already holding a partition, or a snapshot of
another topic id, is refused with nothing changed; a member falls back past a refused or failed holder;
the download runs on a worker thread while the poll loop steps on, the load runs on a worker thread too
while every held partition is paused and the poll loop steps on, then the others are sought back to
the file's offsets, and a partition taken away during its download loads nothing.

The integration tier (tests/integration/test_serve_group_boot.py) does it with two real ``serve --group``
members on a real broker.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from projector_histories import TOPIC
from test_projection_cut import PARTITIONS, TOPIC_ID, _apply, _history

from throughline.core.partitioning import partition_for
from throughline.projector.cut_load import take_cut, verify_cut
from throughline.projector.exceptions import SnapshotLogMismatchError, SnapshotTargetError
from throughline.projector.member_boot import BOOT_POLL_WAIT, LogFacts, MemberBoots, wants_snapshot
from throughline.projector.store import DuckProjection, LogRecord
from throughline.serve.exceptions import SnapshotFetchError

LOG = _history(11, 400)


def _open(
    path: Path, log: list[LogRecord], partitions: Sequence[int], upto: dict[int, int] | None = None
) -> DuckProjection:
    """A file that applied ``partitions`` of ``log`` (each up to ``upto[p]`` when given)."""
    projection = DuckProjection.open(path, topic=TOPIC)
    projection.bind_log(TOPIC, TOPIC_ID, PARTITIONS)
    kept = [r for r in log if r.partition in partitions and r.offset < (upto or {}).get(r.partition, 1 << 40)]
    _apply(projection, kept)
    return projection


def _rows_of(projection: DuckProjection, partitions: Sequence[int]) -> dict[str, list[Any]]:
    """Every row of the tables that carry a partition, of ``partitions``."""
    return {
        t: [r for r in projection.table_rows(t) if r.get("log_partition") in partitions]
        for t in ("applied_offsets", "turns", "superseded_turns", "quarantine", "repairs")
    }


def _a_project_of(partition: int) -> bytes:
    with_turns = [r for r in LOG if r.partition == partition and r.key]
    return next(r.key for r in with_turns if partition_for(r.key, PARTITIONS) == partition)


def test_a_cut_of_partitions_lands_beside_the_others_and_catches_up_to_the_full_projection(tmp_path: Path) -> None:
    ends = {p: sum(1 for r in LOG if r.partition == p) for p in range(PARTITIONS)}
    half = {p: ends[p] // 2 for p in range(PARTITIONS)}
    with (
        _open(tmp_path / "full.duckdb", LOG, range(PARTITIONS)) as full,
        _open(tmp_path / "peer.duckdb", LOG, range(PARTITIONS), half) as peer,
        _open(tmp_path / "member.duckdb", LOG, [0, 1]) as member,
    ):
        take_cut(peer, tmp_path / "cut", [2, 3])  # the peer is half way: the member catches up from there
        before = _rows_of(member, [0, 1])
        project = _a_project_of(2)
        with member.view() as view:
            assert view.head(project) is None  # read (and cached) before the load
        woke: list[bool] = []
        waiter = threading.Thread(target=lambda: woke.append(member.wait_applied(2, half[2], 10.0)))
        waiter.start()
        loaded = member.load_cut_partitions(tmp_path / "cut", verify_cut(tmp_path / "cut"))
        waiter.join(10.0)
        assert loaded == {2: half[2], 3: half[3]} and woke == [True]
        assert member.applied_offsets() == {0: ends[0], 1: ends[1], 2: half[2], 3: half[3]}
        assert _rows_of(member, [0, 1]) == before  # the other partitions are untouched
        assert _rows_of(member, [2, 3]) == _rows_of(peer, [2, 3])
        with member.view() as view, peer.view() as theirs:
            assert view.head(project) is not None and view.head(project) == theirs.head(project)
        _apply(member, [r for r in LOG if r.partition in (2, 3)], start=half)  # from the snapshot's offsets
        assert member.applied_offsets() == full.applied_offsets()
        assert member.table_digests() == full.table_digests()
    with (
        DuckProjection.open(tmp_path / "member.duckdb", read_only=True) as reopened,  # it is in the file
        DuckProjection.open(tmp_path / "full.duckdb", read_only=True) as again,
    ):
        assert reopened.table_digests() == again.table_digests()


def test_a_file_already_holding_a_partition_refuses_it_and_keeps_everything(tmp_path: Path) -> None:
    with (
        _open(tmp_path / "peer.duckdb", LOG, range(PARTITIONS)) as peer,
        _open(tmp_path / "member.duckdb", LOG, [1, 2], {2: 3}) as member,
    ):
        take_cut(peer, tmp_path / "cut", [0, 2])
        digests, offsets = member.table_digests(), member.applied_offsets()
        with pytest.raises(SnapshotTargetError, match="already holds"):
            member.load_cut_partitions(tmp_path / "cut", verify_cut(tmp_path / "cut"))
        assert member.table_digests() == digests and member.applied_offsets() == offsets
        _apply(member, [r for r in LOG if r.partition == 2], start={2: 3})  # it still writes
        assert member.applied_offsets()[2] == peer.applied_offsets()[2]


def test_a_far_behind_partition_is_replaced_by_a_cut_ahead_of_it_and_never_by_one_behind(tmp_path: Path) -> None:
    ends = {p: sum(1 for r in LOG if r.partition == p) for p in range(PARTITIONS)}
    with (
        _open(tmp_path / "full.duckdb", LOG, range(PARTITIONS)) as full,
        _open(tmp_path / "member.duckdb", LOG, range(PARTITIONS), {2: 5, 3: ends[3] // 2}) as member,
        _open(tmp_path / "old.duckdb", LOG, [2], {2: 4}) as old,
    ):
        take_cut(full, tmp_path / "cut", [2, 3])
        take_cut(old, tmp_path / "old", [2])
        before = _rows_of(member, [0, 1])
        with pytest.raises(SnapshotTargetError, match="not behind"):  # the file is at 5, that cut at 4
            member.load_cut_partitions(tmp_path / "old", verify_cut(tmp_path / "old"), replace=True)
        assert member.applied_offsets()[2] == 5
        loaded = member.load_cut_partitions(tmp_path / "cut", verify_cut(tmp_path / "cut"), replace=True)
        assert loaded == {2: ends[2], 3: ends[3]}
        assert _rows_of(member, [0, 1]) == before
        assert member.table_digests() == full.table_digests()  # the old rows of 2 and 3 are gone, not mixed


def test_a_cut_of_another_topic_id_is_refused(tmp_path: Path) -> None:
    with (
        _open(tmp_path / "peer.duckdb", LOG, range(PARTITIONS)) as peer,
        _open(tmp_path / "member.duckdb", LOG, [0]) as member,
    ):
        take_cut(peer, tmp_path / "cut", [3])
        manifest = verify_cut(tmp_path / "cut")
        other = type(manifest)(**{**{f: getattr(manifest, f) for f in manifest.__slots__}, "topic_id": "B" * 22})
        digests = member.table_digests()
        with pytest.raises(SnapshotLogMismatchError, match="topic id"):
            member.load_cut_partitions(tmp_path / "cut", other)
        assert member.table_digests() == digests and 3 not in member.applied_offsets()


class Consumer:
    """The member's consumer as ``MemberBoots`` sees it: what it holds, pauses and seeks."""

    def __init__(self, assigned: Sequence[int]) -> None:
        self.assigned = frozenset(assigned)
        self.paused: set[int] = set()
        self.seeks: dict[int, int] = {}

    def pause(self, partitions: Sequence[int]) -> None:
        self.paused |= set(partitions) & self.assigned

    def resume(self, partitions: Sequence[int]) -> None:
        self.paused -= set(partitions)

    def seek(self, partition: int, offset: int) -> None:
        self.seeks[partition] = offset


def _owners(*urls: str) -> Any:
    """An owner map naming ``urls`` as every partition's holders (only ``urls`` and ``members`` are read)."""
    return SimpleNamespace(urls=lambda p: urls, members=[SimpleNamespace(url=u) for u in urls])


def _settle(boots: MemberBoots, consumer: Consumer, partition: int, timeout: float = 30.0) -> None:
    """Step (as the poll loop does) until ``partition`` is no longer booting, bounded in time."""
    deadline = time.monotonic() + timeout
    while partition in boots.booting:
        assert time.monotonic() < deadline, f"partition {partition} still booting after {timeout:g}s"
        boots.step(consumer)
        time.sleep(0.01)


def test_a_member_falls_back_past_a_failed_or_damaged_holder(tmp_path: Path) -> None:
    ends = {p: sum(1 for r in LOG if r.partition == p) for p in range(PARTITIONS)}
    with (
        _open(tmp_path / "peer.duckdb", LOG, range(PARTITIONS)) as peer,
        _open(tmp_path / "member.duckdb", LOG, [0]) as member,
    ):
        take_cut(peer, tmp_path / "good", [1])
        take_cut(peer, tmp_path / "bad", [1])
        with open(tmp_path / "bad" / "turns.parquet", "r+b") as f:  # one flipped byte: a digest mismatch
            f.seek(40)
            byte = f.read(1)
            f.seek(40)
            f.write(bytes([byte[0] ^ 0xFF]))
        asked: list[str] = []

        def fetch(holder: str, partitions: Sequence[int], out_dir: Path, cancel: threading.Event) -> None:
            asked.append(f"{holder}/{','.join(map(str, partitions))}")
            if holder == "http://down":
                raise SnapshotFetchError("cannot fetch a snapshot from http://down: refused")
            shutil.copytree(tmp_path / holder.removeprefix("http://"), out_dir)

        facts = LogFacts(TOPIC, TOPIC_ID, PARTITIONS)
        # The log ends before the snapshot's offset: a stale or other cluster, refused (nothing loaded);
        # the member catches up from its file's offset, 0.
        consumer = Consumer([1, 2])
        behind = MemberBoots(member, fetch, facts, lambda p: ends[p] - 1, "http://me")
        behind.gained(consumer, [1], _owners("http://good", "http://me"))
        assert consumer.paused == {1} and behind.booting == {1}
        _settle(behind, consumer, 1)
        assert 1 not in member.applied_offsets() and consumer.seeks == {1: 0} and consumer.paused == set()
        # Down, then damaged, then good: the good one is loaded and the partition fetched from its offset.
        consumer = Consumer([1, 2])
        boots = MemberBoots(member, fetch, facts, lambda p: ends[p], "http://me", parallel=1)
        boots.gained(consumer, [1], _owners("http://down", "http://bad", "http://good"))
        _settle(boots, consumer, 1)
        assert member.applied_offsets()[1] == ends[1] and consumer.seeks == {1: ends[1], 2: 0} and not consumer.paused
        assert asked == ["http://good/1", "http://down/1", "http://bad/1", "http://good/1"]
        assert _rows_of(member, [1]) == _rows_of(peer, [1])
        # Every holder refused (a damaged one; one answering with another partition): the member
        # catches up from the log.
        boots.gained(consumer, [2], _owners("http://bad", "http://good"))
        _settle(boots, consumer, 2)
        assert 2 not in member.applied_offsets() and consumer.seeks[2] == 0 and not consumer.paused
        # A partition already loaded, gained again: nothing to boot (the file holds it).
        boots.gained(consumer, [1], _owners("http://good"))
        assert boots.booting == frozenset()
    assert not list(tmp_path.glob(".member.duckdb.member-boot-*"))  # the downloads are removed


def test_a_slow_download_never_holds_up_the_poll_loop_and_loads_between_two_polls(tmp_path: Path) -> None:
    ends = {p: sum(1 for r in LOG if r.partition == p) for p in range(PARTITIONS)}
    release = threading.Event()
    started = threading.Event()
    with (
        _open(tmp_path / "peer.duckdb", LOG, range(PARTITIONS)) as peer,
        _open(tmp_path / "member.duckdb", LOG, [0]) as member,
    ):
        take_cut(peer, tmp_path / "cut", [1])
        loop = threading.get_ident()
        threads: list[int] = []

        def fetch(holder: str, partitions: Sequence[int], out_dir: Path, cancel: threading.Event) -> None:
            threads.append(threading.get_ident())
            started.set()
            assert release.wait(30.0)
            shutil.copytree(tmp_path / "cut", out_dir)

        consumer = Consumer([0, 1])
        boots = MemberBoots(member, fetch, LogFacts(TOPIC, TOPIC_ID, PARTITIONS), lambda p: ends[p], "http://me")
        boots.gained(consumer, [0, 1], _owners("http://peer"))
        assert boots.booting == {1} and consumer.paused == {1}  # 0 is in the file: it goes on as it was
        took = time.monotonic()
        for _ in range(20):  # twenty polls while the download hangs: each step returns at once
            boots.step(consumer)
        took = time.monotonic() - took
        assert started.wait(30.0) and threads and threads[0] != loop  # on a worker thread
        assert took < 5.0 and boots.booting == {1} and consumer.paused == {1} and 1 not in member.applied_offsets()
        release.set()
        _settle(boots, consumer, 1)
        assert (
            member.applied_offsets()[1] == ends[1]
            and consumer.seeks == {1: ends[1], 0: ends[0]}
            and not consumer.paused
        )
        assert _rows_of(member, [1]) == _rows_of(peer, [1])
    assert not list(tmp_path.glob(".member.duckdb.member-boot-*"))


def test_a_partition_taken_away_during_its_download_loads_nothing(tmp_path: Path) -> None:
    ends = {p: sum(1 for r in LOG if r.partition == p) for p in range(PARTITIONS)}
    started, cancelled, finished = threading.Event(), threading.Event(), threading.Event()
    leftover = tmp_path / ".member.duckdb.member-boot-killed"  # a member killed during a download left it
    leftover.mkdir()
    (leftover / "snapshot.tar").write_bytes(b"partial")
    with (
        _open(tmp_path / "peer.duckdb", LOG, range(PARTITIONS)) as peer,
        _open(tmp_path / "member.duckdb", LOG, [0]) as member,
    ):
        take_cut(peer, tmp_path / "cut", [2])

        def fetch(holder: str, partitions: Sequence[int], out_dir: Path, cancel: threading.Event) -> None:
            shutil.copytree(tmp_path / "cut", out_dir)  # downloaded part of it, then told to stop
            started.set()
            try:
                if cancel.wait(30.0):
                    cancelled.set()
                    raise SnapshotFetchError("cancelled")
            finally:
                finished.set()

        consumer = Consumer([0, 2])
        boots = MemberBoots(member, fetch, LogFacts(TOPIC, TOPIC_ID, PARTITIONS), lambda p: ends[p], "http://me")
        assert not leftover.exists()
        boots.gained(consumer, [2], _owners("http://peer"))
        boots.step(consumer)
        assert started.wait(30.0)
        consumer.assigned = frozenset({0})  # a rebalance inside the next poll took partition 2 away
        boots.step(consumer)
        assert boots.booting == frozenset() and cancelled.wait(30.0) and finished.wait(30.0)
        assert 2 not in member.applied_offsets() and consumer.seeks == {}
        deadline = time.monotonic() + 30.0
        while list(tmp_path.glob(".member.duckdb.member-boot-*")):  # the worker removes its download
            assert time.monotonic() < deadline
            time.sleep(0.01)


def test_an_empty_or_far_behind_partition_wants_a_snapshot() -> None:
    assert wants_snapshot(0, 10) and not wants_snapshot(0, 0) and not wants_snapshot(5, 1_000_000)
    assert wants_snapshot(5, 1_000_005) and wants_snapshot(5, 15, far_behind=10) and not wants_snapshot(5, 14, 10)


def test_a_long_load_never_holds_up_the_poll_loop_and_nothing_is_applied_meanwhile(tmp_path: Path) -> None:
    ends = {p: sum(1 for r in LOG if r.partition == p) for p in range(PARTITIONS)}
    release, loading = threading.Event(), threading.Event()
    with (
        _open(tmp_path / "peer.duckdb", LOG, range(PARTITIONS)) as peer,
        _open(tmp_path / "member.duckdb", LOG, [0], {0: 7}) as member,
    ):
        real_load = member.load_cut_partitions
        threads: list[int] = []

        def load(cut_dir: Path, manifest: Any, **kw: Any) -> dict[int, int]:
            threads.append(threading.get_ident())
            loading.set()
            assert release.wait(30.0)
            return real_load(cut_dir, manifest, **kw)

        member.load_cut_partitions = load  # type: ignore[method-assign]

        def fetch(holder: str, partitions: Sequence[int], out_dir: Path, cancel: threading.Event) -> None:
            take_cut(peer, out_dir, partitions)

        consumer = Consumer([0, 1, 2])
        boots = MemberBoots(member, fetch, LogFacts(TOPIC, TOPIC_ID, PARTITIONS), lambda p: ends[p], "http://me")
        boots.gained(consumer, [0, 1, 2], _owners("http://peer"))
        assert boots.booting == {1, 2} and consumer.paused == {1, 2}
        deadline = time.monotonic() + 30.0
        while not boots.loading:  # the download, then the load starts at a step
            assert time.monotonic() < deadline
            boots.step(consumer)
            time.sleep(0.01)
        assert loading.wait(30.0) and threads[0] != threading.get_ident()  # on a worker thread
        took = time.monotonic()
        holds = [boots.step(consumer) for _ in range(20)]  # twenty polls during the load: each returns at once
        took = time.monotonic() - took
        assert took < 5.0 and holds == [True] * 20
        assert consumer.paused == {0, 1, 2}  # nothing at all is fetched: the load has the file
        assert len(threads) == 1  # the other partition's load waits its turn, downloaded or not
        release.set()
        _settle(boots, consumer, 1)
        _settle(boots, consumer, 2)  # loaded after 1: one load at a time
        assert boots.step(consumer) is False and not boots.loading and len(threads) == 2
        assert member.applied_offsets() == {0: 7, 1: ends[1], 2: ends[2]}
        assert consumer.seeks == {0: 7, 1: ends[1], 2: ends[2]} and not consumer.paused  # 0 from the file's offset
    assert not list(tmp_path.glob(".member.duckdb.member-boot-*"))


def test_polls_wait_briefly_only_while_a_partition_boots(tmp_path: Path) -> None:
    ends = {p: sum(1 for r in LOG if r.partition == p) for p in range(PARTITIONS)}
    release = threading.Event()
    with (
        _open(tmp_path / "peer.duckdb", LOG, range(PARTITIONS)) as peer,
        _open(tmp_path / "member.duckdb", LOG, [0]) as member,
    ):
        take_cut(peer, tmp_path / "cut", [1])

        def fetch(holder: str, partitions: Sequence[int], out_dir: Path, cancel: threading.Event) -> None:
            assert release.wait(30.0)
            shutil.copytree(tmp_path / "cut", out_dir)

        consumer = Consumer([0, 1])
        boots = MemberBoots(member, fetch, LogFacts(TOPIC, TOPIC_ID, PARTITIONS), lambda p: ends[p], "http://me")
        assert boots.poll_wait(0.5) == 0.5  # nothing booting: the projector's own poll timeout
        boots.gained(consumer, [0, 1], _owners("http://peer"))
        boots.step(consumer)
        assert boots.poll_wait(0.5) == BOOT_POLL_WAIT and boots.poll_wait(0.01) == 0.01  # a download in flight
        release.set()
        _settle(boots, consumer, 1)
        assert boots.poll_wait(0.5) == 0.5 and member.applied_offsets()[1] == ends[1]
