"""``GroupConsumer`` and ``OwnerAssignor`` against the real broker: Kafka 4.1's classic group protocol
carries the members' URLs and the owner map, accepts overlapping assignments (K = 2), rebalances on
join, leave and crash, and keeps the fetch positions of the partitions a member keeps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kafka import KafkaProducer

from throughline.log import GroupConsumer, GroupView
from throughline.log.group import HEARTBEAT_INTERVAL_MS, PROTOCOL_NAME, SESSION_TIMEOUT_MS

PARTITIONS = 6
RECORDS_PER_PARTITION = 5
DEADLINE_S = 90.0


class Member:
    """A ``GroupConsumer`` polled on its own thread, recording what it fetched and saw."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        name: str,
        *,
        start_at: int = 0,
        poll_timeout: float = 0.2,
        **options: Any,
    ) -> None:
        self.name = name
        self._poll_timeout = poll_timeout
        self.url = f"http://127.0.0.1:{18000 + int(name[1:])}"
        self.records: dict[int, list[int]] = {}
        self.views: list[GroupView] = []
        self.callback_threads: set[str] = set()
        self.stored: set[int] = set()
        self._start_at = start_at
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self.consumer = GroupConsumer(
            [bootstrap],
            topic,
            group=group,
            url=self.url,
            stored=lambda: set(self.stored),
            start_offset=lambda p: self._start_at,
            on_change=self._changed,
            client_id=f"test-{name}",
            timeout=30.0,
            kafka_config=None,
            **options,
        )
        self.thread = threading.Thread(target=self._run, name=f"poller-{name}", daemon=True)
        self.thread.start()

    def _changed(self, view: GroupView) -> None:
        with self._lock:
            self.views.append(view)
            self.callback_threads.add(threading.current_thread().name)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                polled = self.consumer.poll(self._poll_timeout, 500)
                with self._lock:
                    for partition, records in polled.items():
                        self.records.setdefault(partition, []).extend(r.offset for r in records)
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def view(self) -> GroupView | None:
        return self.consumer.view

    def offsets(self, partition: int) -> list[int]:
        with self._lock:
            return list(self.records.get(partition, []))

    def stop(self, *, leave: bool = True) -> None:
        self._stop.set()
        self.thread.join(timeout=30)
        if leave:
            self.consumer.close()


def _wait(what: str, condition: Callable[[], bool], timeout: float = DEADLINE_S) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{_DESCRIBE.get(what, lambda: '')()}")


#: What a timed-out wait prints about the members (set by the tests that wait for a settled group).
_DESCRIBE: dict[str, Callable[[], str]] = {}


def _views(members: list[Member]) -> str:
    rows = []
    for m in members:
        v = m.view()
        rows.append(
            f"\n  {m.name}: "
            + (
                "no view"
                if v is None
                else f"generation {v.generation}, assigned {sorted(v.assigned)}, "
                f"map of {len(v.owner_map.members) if v.owner_map else None} members, error {v.error}"
            )
            + f", thread alive {m.thread.is_alive()}, error {m.error!r}"
        )
    return "".join(rows)


def _settled(members: list[Member], count: int) -> bool:
    """Every member is in one generation of exactly these members, with an owner map of the whole topic."""
    for m in members:
        if m.error is not None:
            raise AssertionError(f"{m.name}'s poll loop failed: {m.error!r}") from m.error
    views = [m.view() for m in members]
    if any(v is None or v.owner_map is None for v in views):
        return False
    generations = {v.generation for v in views if v is not None}
    maps = {v.owner_map for v in views if v is not None}
    # A leader that assigned before it had the topic's metadata hands out a map of no partitions; the
    # member's next join (kafka-python sees the metadata change) replaces it, so that is not settled yet.
    owner_map = next(iter(maps))
    return (
        len(generations) == 1
        and len(maps) == 1
        and owner_map is not None
        and len(owner_map.members) == count
        and owner_map.partitions == PARTITIONS
    )


def _produce(bootstrap: str, topic: str) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    try:
        for p in range(PARTITIONS):
            for i in range(RECORDS_PER_PARTITION):
                producer.send(topic, key=b"k", value=b"%d-%d" % (p, i), partition=p)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=10)


@pytest.fixture
def group_topic(kafka_bootstrap: str, kafka_create_topic: Callable[..., str], kafka_topic_name: str) -> str:
    kafka_create_topic(kafka_topic_name, partitions=PARTITIONS)
    _produce(kafka_bootstrap, kafka_topic_name)
    return kafka_topic_name


@pytest.fixture
def members() -> Iterator[list[Member]]:
    started: list[Member] = []
    yield started
    for member in started:
        try:
            member.stop()
        except Exception:
            pass


def test_three_members_two_copies_overlap_and_know_every_url(
    kafka_bootstrap: str, group_topic: str, kafka_group_id: str, kafka_admin: Any, members: list[Member]
) -> None:
    members += [Member(kafka_bootstrap, group_topic, kafka_group_id, f"m{i}") for i in range(3)]
    _wait("three members in one generation", lambda: _settled(members, 3))
    views = [m.view() for m in members]
    assert all(v is not None for v in views)
    owner_map = views[0].owner_map  # type: ignore[union-attr]
    assert owner_map is not None and owner_map.copies == 2 and owner_map.partitions == PARTITIONS
    assert sorted(m.url for m in owner_map.members) == sorted(m.url for m in members)
    for member, view in zip(members, views, strict=True):
        assert view is not None
        assert view.assigned == owner_map.partitions_of(view.member_id)  # Kafka's assignment = the map's
        assert len(view.assigned) == 4
        assert member.consumer.assigned == view.assigned
        assert owner_map.member(view.member_id).url == member.url  # type: ignore[union-attr]
    for p in range(PARTITIONS):
        assert len(owner_map.urls(p)) == 2
    # The broker and kafka-python accept overlapping assignments: both holders of a partition fetch
    # each new record once, and a member fetches nothing of the partitions it does not hold (earlier
    # generations may have given it others: only records produced now tell).
    marks = {m.name: {p: len(m.offsets(p)) for p in range(PARTITIONS)} for m in members}
    _produce(kafka_bootstrap, group_topic)
    second = list(range(RECORDS_PER_PARTITION, 2 * RECORDS_PER_PARTITION))
    for member, view in zip(members, views, strict=True):
        assert view is not None
        for p in view.assigned:
            _wait(f"{member.name} fetching partition {p}", lambda m=member, p=p: second[-1] in m.offsets(p))
            assert [o for o in member.offsets(p) if o >= second[0]] == second
    time.sleep(1.0)
    for member, view in zip(members, views, strict=True):
        assert view is not None
        for p in set(range(PARTITIONS)) - view.assigned:
            assert member.offsets(p)[marks[member.name][p] :] == [], (member.name, p)
    # Kafka 4.1 keeps the group on the classic protocol, under throughline's assignor.
    listed = {g["group_id"]: g for g in kafka_admin.list_groups()}
    assert listed[kafka_group_id]["protocol_type"] == "consumer"
    assert listed[kafka_group_id].get("group_type", "classic").lower() == "classic"
    described = kafka_admin.describe_groups([kafka_group_id])[kafka_group_id]
    assert described["protocol_type"] == "consumer"
    assert described["protocol_data"] == PROTOCOL_NAME
    assert described["group_state"] == "Stable"
    # kafka-python runs the rebalance callbacks on its IO thread, not on the polling thread.
    for member in members:
        assert member.callback_threads and f"poller-{member.name}" not in member.callback_threads
        assert member.error is None


def test_a_first_generation_maps_the_whole_topic(
    kafka_bootstrap: str, group_topic: str, kafka_group_id: str, members: list[Member]
) -> None:
    # The member learns the topic's partitions before it subscribes, so even the first assignment
    # (its own, as the lone leader) covers every partition instead of none.
    members.append(Member(kafka_bootstrap, group_topic, kafka_group_id, "m0"))
    _wait("a first generation", lambda: bool(members[0].views))
    first = members[0].views[0]
    assert first.owner_map is not None and first.owner_map.partitions == PARTITIONS, first
    assert first.assigned == frozenset(range(PARTITIONS))


def test_a_member_whose_polls_end_in_the_middle_of_a_join_still_finishes_it(
    kafka_bootstrap: str, group_topic: str, kafka_group_id: str, members: list[Member]
) -> None:
    # kafka-python 3.0.12 leaves a join that outlasts a poll in flight for the next poll to finish,
    # but a poll finishes it only while the member "needs to rejoin", and a rejoin asked for by a
    # metadata change (the leader assigned from other partitions than the topic has now) stops being
    # needed as soon as the leader assigns again: the member never took that assignment, sent no
    # heartbeat, and the group went on without it for good (seen in CI under load, when a leader's
    # first assignment ran before the topic's metadata came). GroupConsumer finishes such a join.
    # The test makes that metadata change (the private snapshot kafka-python compares) and polls for
    # 1 ms, so that the join outlasts the polls.
    member = Member(kafka_bootstrap, group_topic, kafka_group_id, "m0", poll_timeout=0.001)
    members.append(member)
    _DESCRIBE["one member"] = lambda: _views(members)
    _wait("one member", lambda: _settled(members, 1), timeout=60.0)
    before = member.view()
    assert before is not None
    member.consumer._consumer._coordinator._assignment_snapshot = {}  # "the leader assigned from no partitions"
    _DESCRIBE["the member's next generation"] = lambda: _views(members)
    _wait(
        "the member's next generation",
        lambda: (v := member.view()) is not None and v.generation > before.generation and _settled(members, 1),
        timeout=30.0,
    )
    after = member.view()
    assert after is not None and after.assigned == frozenset(range(PARTITIONS))


def test_a_fourth_member_takes_its_share_and_a_leaver_hands_its_own_on(
    kafka_bootstrap: str, group_topic: str, kafka_group_id: str, members: list[Member]
) -> None:
    members += [Member(kafka_bootstrap, group_topic, kafka_group_id, f"m{i}") for i in range(3)]
    _DESCRIBE["three members"] = lambda: _views(members)
    _wait("three members", lambda: _settled(members, 3))
    before = {m.name: m.view() for m in members}
    marks = {m.name: {p: len(m.offsets(p)) for p in range(PARTITIONS)} for m in members}

    # A fourth joins; it starts the partitions it gains at offset 2 (as a file that applied 0..1 would).
    fourth = Member(kafka_bootstrap, group_topic, kafka_group_id, "m3", start_at=2)
    members.append(fourth)
    _wait("four members", lambda: _settled(members, 4))
    after = {m.name: m.view() for m in members}
    loads = {name: len(v.assigned) for name, v in after.items() if v is not None}
    assert sorted(loads.values()) == [3, 3, 3, 3]
    for name, view in before.items():
        assert view is not None
        assert after[name].assigned <= view.assigned, name  # type: ignore[union-attr]  # the old only give
        assert after[name].generation > view.generation  # type: ignore[union-attr]
    _produce(kafka_bootstrap, group_topic)
    last = 2 * RECORDS_PER_PARTITION - 1
    gained = after["m3"].assigned  # type: ignore[union-attr]
    for p in gained:
        _wait("the fourth's fetches", lambda p=p: last in fourth.offsets(p))
        assert fourth.offsets(p) == list(range(2, last + 1))
    # A partition an old member kept keeps its fetch position across the rebalance: it goes on with the
    # records produced since, and fetches nothing twice.
    for member in members[:3]:
        kept = after[member.name].assigned  # type: ignore[union-attr]
        for p in kept:
            _wait(f"{member.name} fetching {p}", lambda m=member, p=p: last in m.offsets(p))
            assert member.offsets(p)[-2 * RECORDS_PER_PARTITION :] == list(range(last + 1)), (member.name, p)
            assert sorted(set(member.offsets(p)[marks[member.name][p] :])) == member.offsets(p)[marks[member.name][p] :]

    # One leaves cleanly (LeaveGroup): the others rebalance without waiting for the session timeout.
    leaver = members.pop(1)
    left_at = time.monotonic()
    leaver.stop()
    _wait("three members again", lambda: _settled(members, 3))
    took = time.monotonic() - left_at
    assert took < SESSION_TIMEOUT_MS / 1000, f"a clean leave took {took:.1f} s"
    final = {m.name: m.view() for m in members}
    for name, view in final.items():
        assert view is not None
        assert after[name].assigned <= view.assigned, name  # type: ignore[union-attr]
    owner_map = final["m0"].owner_map  # type: ignore[union-attr]
    assert owner_map is not None and all(len(owner_map.urls(p)) == 2 for p in range(PARTITIONS))
    assert leaver.url not in {m.url for m in owner_map.members}
    print(f"\nclean leave -> rebalanced in {took:.2f} s")


_KILLED_MEMBER = textwrap.dedent(
    """
    import sys, time
    from throughline.log import GroupConsumer
    bootstrap, topic, group = sys.argv[1:4]
    consumer = GroupConsumer([bootstrap], topic, group=group, url="http://127.0.0.1:18099",
                             client_id="test-killed", timeout=30.0, kafka_config=None)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        consumer.poll(0.2, 100)
        if consumer.view is not None:
            print("joined", flush=True)
            break
    while time.monotonic() < deadline:
        consumer.poll(0.2, 100)
    """
)


def test_a_sigkilled_member_drops_out_after_the_session_timeout(
    kafka_bootstrap: str, group_topic: str, kafka_group_id: str, members: list[Member]
) -> None:
    members += [Member(kafka_bootstrap, group_topic, kafka_group_id, f"m{i}") for i in range(2)]
    _wait("two members", lambda: _settled(members, 2))
    victim = subprocess.Popen(
        [sys.executable, "-c", _KILLED_MEMBER, kafka_bootstrap, group_topic, kafka_group_id],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=os.environ.copy(),
    )
    try:
        assert victim.stdout is not None
        assert victim.stdout.readline().strip() == b"joined"
        _wait("three members", lambda: _settled(members, 3))
        owner_map = members[0].view().owner_map  # type: ignore[union-attr]
        assert owner_map is not None and "http://127.0.0.1:18099" in {m.url for m in owner_map.members}
        killed_at = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=30)
        _wait(
            "the others without the killed member", lambda: _settled(members, 2), timeout=SESSION_TIMEOUT_MS / 1000 + 60
        )
        took = time.monotonic() - killed_at
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait(timeout=30)
        if victim.stdout is not None:
            victim.stdout.close()
    # No LeaveGroup was sent: the broker notices only when the session times out, then rebalances.
    assert took >= SESSION_TIMEOUT_MS / 1000 - 2 * HEARTBEAT_INTERVAL_MS / 1000, f"dropped after {took:.1f} s"
    owner_map = members[0].view().owner_map  # type: ignore[union-attr]
    assert owner_map is not None and all(len(owner_map.urls(p)) == 2 for p in range(PARTITIONS))
    print(f"\nSIGKILL -> the others rebalanced without it after {took:.2f} s (session timeout {SESSION_TIMEOUT_MS} ms)")


def test_a_rebalance_waits_for_a_member_that_does_not_poll(
    kafka_bootstrap: str, group_topic: str, kafka_group_id: str, members: list[Member]
) -> None:
    """Joins advance only inside ``poll``: while one member's loop is busy, the group (every member)
    waits for it, up to ``max_poll_interval_ms``, and fetches nothing meanwhile. A group member's
    projector loop must therefore poll often."""
    members += [Member(kafka_bootstrap, group_topic, kafka_group_id, f"m{i}") for i in range(2)]
    _wait("two members", lambda: _settled(members, 2))
    busy = members[1]
    busy._stop.set()  # its loop stops polling; its heartbeats go on (kafka-python's IO thread)
    busy.thread.join(timeout=30)
    stalled_at = time.monotonic()
    members.append(Member(kafka_bootstrap, group_topic, kafka_group_id, "m2"))
    stall = 6.0
    time.sleep(stall / 2)
    marks = {p: len(members[0].offsets(p)) for p in range(PARTITIONS)}
    _produce(kafka_bootstrap, group_topic)
    time.sleep(max(0.0, stalled_at + stall - time.monotonic()))
    assert members[0].view().generation == members[1].view().generation  # type: ignore[union-attr]  # still waiting
    assert members[2].view() is None
    # kafka-python fetches nothing while a join is in flight: the waiting member got none of the new records.
    assert {p: len(members[0].offsets(p)) for p in range(PARTITIONS)} == marks
    busy._stop.clear()
    busy.thread = threading.Thread(target=busy._run, name="poller-m1", daemon=True)
    busy.thread.start()
    _wait("three members once the busy one polls again", lambda: _settled(members, 3))
    took = time.monotonic() - stalled_at
    assert took >= stall
    _wait(
        "the held-up records", lambda: sum(len(members[0].offsets(p)) for p in range(PARTITIONS)) > sum(marks.values())
    )
    print(f"\na member busy for {stall:.0f} s held the rebalance up for {took:.2f} s")


def test_a_group_name_taken_by_another_kind_of_consumer_is_refused(
    kafka_bootstrap: str, group_topic: str, kafka_group_id: str, kafka_admin: Any
) -> None:
    from kafka import KafkaConsumer

    from throughline.log import GroupRefusedError

    other = KafkaConsumer(
        group_topic, bootstrap_servers=kafka_bootstrap, group_id=kafka_group_id, enable_auto_commit=False
    )
    member = None
    try:

        def range_group_stable() -> bool:
            other.poll(timeout_ms=200)
            described = kafka_admin.describe_groups([kafka_group_id])[kafka_group_id]
            return described["group_state"] == "Stable" and described["protocol_data"] == "range"

        _wait("the other consumer's group", range_group_stable)
        member = GroupConsumer(
            [kafka_bootstrap],
            group_topic,
            group=kafka_group_id,
            url="http://127.0.0.1:18050",
            client_id="test-refused",
            timeout=30.0,
            kafka_config=None,
        )
        deadline = time.monotonic() + DEADLINE_S
        with pytest.raises(GroupRefusedError) as caught:
            while time.monotonic() < deadline:
                member.poll(0.2, 10)
        assert caught.value.code == "group_protocol_mismatch"
        assert caught.value.exit_code == 2
    finally:
        if member is not None:
            member.close()
        other.close()
