"""A member of a ``serve --group``: Kafka's classic group protocol with throughline's own assignor.

Every member joins one consumer group on the topic. Its JoinGroup subscription carries a
``MemberSubscription`` as user data (its advertised URL, the partitions it held, the partitions its
file has rows for, its ``--copies``); the leader's ``OwnerAssignor`` decides with the pure
``throughline.core.assignment.assign_owners`` and sends every member its partitions plus the whole
``OwnerMap`` as the assignment's user data, as Kafka Streams does. The broker takes the assignment as
opaque bytes: a partition given to two members (K = 2) is fetched by both.

``GroupConsumer`` is the fetching consumer of one such member, the group counterpart of
``PartitionConsumer``: nothing is committed to Kafka (offsets live in each member's DuckDB file), a
partition the member gains starts at the offset the caller's ``start_offset`` gives (its file's
applied offset), a partition it keeps keeps its fetch position, and every new generation is published
as a ``GroupView`` (generation, member id, owner map, partitions held). kafka-python stays inside.

kafka-python 3.0 runs the group's heartbeats, and the rebalance callbacks of both the assignor and the
listener, on its IO thread; the JoinGroup/SyncGroup round trips themselves advance only while the
caller is inside ``poll``, so the caller must poll at least every ``max_poll_interval_ms`` (else the
heartbeat thread leaves the group) and, during a rebalance, promptly (the group waits for every member
to rejoin, up to that same interval), and no member fetches anything until the rebalance completes.
docs/scale-out.md has the numbers and what they mean.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kafka import TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.coordinator.assignors.abstract import (
    AbstractPartitionAssignor,
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)

from throughline.core.assignment import assign_owners
from throughline.core.exceptions import GroupDataError
from throughline.core.owner_map import MemberSubscription, OwnerMap
from throughline.log.config import KafkaClientConfig
from throughline.log.consumer import DEFAULT_FETCH, FetchingConsumer, FetchSettings

log = logging.getLogger(__name__)

#: The assignment protocol's name in JoinGroup: every member of a throughline group offers only this,
#: so a consumer of another kind (or an incompatible throughline) is refused by the broker.
PROTOCOL_NAME = "throughline-owners"
#: ``ConsumerProtocolSubscription``/``Assignment`` version we write (topics + user data).
_PROTOCOL_VERSION = 0

#: How long the broker waits without a heartbeat before it drops a member (a SIGKILLed member's
#: partitions move after about this long). The broker accepts 6 s .. 30 min by default
#: (``group.min.session.timeout.ms``, ``group.max.session.timeout.ms``).
SESSION_TIMEOUT_MS = 10_000
#: Heartbeats (on kafka-python's IO thread): a third of the session timeout or less, so two may be lost;
#: also how soon a member hears that a rebalance began.
HEARTBEAT_INTERVAL_MS = 1_000
#: The longest the caller may go between two polls before the member leaves the group; also how long
#: the group waits for every member to rejoin during a rebalance (the classic protocol's rebalance timeout).
MAX_POLL_INTERVAL_MS = 30_000


@dataclass(frozen=True, slots=True)
class GroupView:
    """What one member knows of its group after a rebalance.

    ``owner_map`` is ``None`` when the leader's map could not be read (``error`` says why: a leader of
    another version); ``assigned`` is what Kafka gave this member either way.
    """

    generation: int
    member_id: str
    assigned: frozenset[int]
    owner_map: OwnerMap | None
    error: str | None = None


class OwnerAssignor(AbstractPartitionAssignor):
    """kafka-python's partition assignor for a throughline group on one topic.

    ``subscription()`` is asked for this member's ``MemberSubscription`` at every join, and
    ``on_generation(generation, owner_map, error, assigned)`` is told every assignment; both run on
    kafka-python's IO thread (quick and thread-safe). ``held`` is filled in here from the last
    assignment.

    It speaks kafka-python's default, eager protocol. The cooperative one (KIP-429) would not let a
    member fetch during a rebalance either: kafka-python 3.0 fetches nothing while a join is in flight
    (its ``poll`` returns empty until the join completes), and it would add a second rebalance after
    every move. Overlapping holders need no two-step hand-over, so the final map is handed out at once.
    """

    name = PROTOCOL_NAME
    version = _PROTOCOL_VERSION

    def __init__(
        self,
        topic: str,
        subscription: Callable[[], MemberSubscription],
        on_generation: Callable[[int, OwnerMap | None, str | None, frozenset[int]], None] | None = None,
    ) -> None:
        self.topic = topic
        self._subscription = subscription
        self._on_generation = on_generation
        self._lock = threading.Lock()
        self._held: frozenset[int] = frozenset()

    # ----------------------------------------------------------------- kafka-python's assignor API

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolSubscription:
        """This member's JoinGroup subscription: the topic and its ``MemberSubscription``."""
        offer = self._subscription()
        with self._lock:
            held = self._held
        offer = MemberSubscription(url=offer.url, held=held, stored=offer.stored, copies=offer.copies)
        return ConsumerProtocolSubscription(version=self.version, topics=sorted(topics), user_data=offer.encode())

    def assign(self, cluster: Any, members: Sequence[Any]) -> dict[str, ConsumerProtocolAssignment]:
        """The leader's decision: every member's partitions and the whole owner map."""
        partitions = cluster.partitions_for_topic(self.topic) or set()
        count = max(partitions) + 1 if partitions else 0
        offers: dict[str, MemberSubscription] = {}
        for member in members:
            topics = list(member.metadata.topics or ())
            if topics != [self.topic]:
                log.warning(
                    "group member %s subscribes to %s, not [%s]: it gets no partitions",
                    member.member_id,
                    topics,
                    self.topic,
                )
                continue
            try:
                offers[member.member_id] = MemberSubscription.decode(bytes(member.metadata.user_data or b""))
            except GroupDataError as exc:
                log.warning(
                    "group member %s sent a subscription this member cannot read (%s): it gets no partitions",
                    member.member_id,
                    exc.message,
                )
        owner_map = assign_owners(offers, count)
        urls: dict[str, list[str]] = {}
        for m in owner_map.members:
            urls.setdefault(m.url, []).append(m.member_id)
        for url, ids in urls.items():
            if len(ids) > 1:
                log.warning("members %s all advertise %s: reads forwarded there reach only one of them", ids, url)
        encoded = owner_map.encode()
        return {
            member.member_id: ConsumerProtocolAssignment(
                self.version,
                [(self.topic, sorted(owner_map.partitions_of(member.member_id)))],
                encoded,
            )
            for member in members
        }

    def on_assignment(self, assignment: ConsumerProtocolAssignment, generation: int) -> None:
        """Remember this generation's partitions (the next subscription's ``held``) and pass the map on."""
        assigned = frozenset(tp.partition for tp in assignment.partitions() if tp.topic == self.topic)
        owner_map: OwnerMap | None = None
        error: str | None = None
        try:
            owner_map = OwnerMap.decode(bytes(assignment.user_data or b""))
        except GroupDataError as exc:
            error = f"{exc.code}: {exc.message}"
            log.warning("generation %s: the leader's owner map cannot be read (%s)", generation, error)
        with self._lock:
            self._held = assigned
        if self._on_generation is not None:
            self._on_generation(int(generation), owner_map, error, assigned)

    # ------------------------------------------------------------------------------- for the member

    def forget_held(self) -> None:
        """After the member was dropped from the group: it holds nothing until the next assignment."""
        with self._lock:
            self._held = frozenset()


class _Listener(ConsumerRebalanceListener):
    """Tells the member when kafka-python dropped its partitions (and their positions)."""

    def __init__(self, member: GroupConsumer) -> None:
        self.member = member

    def on_partitions_revoked(self, revoked: Any) -> None:
        # Eager: everything, before each join; kafka-python keeps the positions of what the member keeps,
        # and the assignor's on_assignment publishes the new generation.
        return None

    def on_partitions_assigned(self, assigned: Any) -> None:
        return None  # seeks happen in the assignor's on_assignment, before kafka-python calls this

    def on_partitions_lost(self, lost: Any) -> None:
        # Dropped from the group (session expired, fenced): the assignment and positions are cleared.
        self.member._lost()


class GroupConsumer(FetchingConsumer):
    """Fetches the partitions the group gives this member, from positions its own file decides."""

    def __init__(
        self,
        servers: Sequence[str],
        topic: str,
        *,
        group: str,
        url: str,
        copies: int | None = None,
        stored: Callable[[], Iterable[int]] | None = None,
        start_offset: Callable[[int], int] | None = None,
        on_change: Callable[[GroupView], None] | None = None,
        on_lost: Callable[[], None] | None = None,
        client_id: str,
        timeout: float,
        fetch: FetchSettings = DEFAULT_FETCH,
        session_timeout_ms: int = SESSION_TIMEOUT_MS,
        heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS,
        max_poll_interval_ms: int = MAX_POLL_INTERVAL_MS,
        kafka_config: KafkaClientConfig | None = None,
    ) -> None:
        """Connect (bounded by ``timeout`` seconds) and subscribe; the member joins at its first polls.

        ``url``: what this member advertises; ``copies``: its ``--copies`` (``None``: the default);
        ``stored()``: the partitions its file has rows for, asked at every join; ``start_offset(p)``:
        where to fetch a partition it gains (default 0); ``on_change(view)``: called with every new
        generation's view; ``on_lost()``: called when the member was dropped from the group (its
        partitions are no longer its own until the next generation). All four run on kafka-python's
        IO thread, inside a ``poll`` call: keep them quick and thread-safe. ``fetch``: its fetch sizes
        (``FetchSettings``, as ``PartitionConsumer`` takes them).
        """
        self.topic = topic
        self.group = group
        # What every join offers (with the stored partitions of the moment); refuses a URL or copies
        # the group could not carry before anything connects.
        self._subscription = MemberSubscription(url=url, copies=copies)
        self._stored = stored
        self._start_offset = start_offset
        self._on_change = on_change
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._view: GroupView | None = None
        self._assigned: frozenset[int] = frozenset()
        self._assignor = OwnerAssignor(topic, self._offer, self._generation)
        super().__init__(
            servers,
            client_id=client_id,
            timeout=timeout,
            fetch=fetch,
            kafka_config=kafka_config,
            group_id=group,
            partition_assignment_strategy=[self._assignor],
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=heartbeat_interval_ms,
            max_poll_interval_ms=max_poll_interval_ms,
        )
        try:
            with self._errors:
                # The topic's metadata first: a leader that assigns before it knows the partitions
                # hands every member an owner map of none, for a whole generation.
                self._consumer.partitions_for_topic(topic)
                self._consumer.subscribe(topics=[topic], listener=_Listener(self))
        except BaseException:
            self._consumer.close(autocommit=False)
            raise

    # ---------------------------------------------------------------------------------- callbacks

    def _offer(self) -> MemberSubscription:
        stored = frozenset(self._stored()) if self._stored is not None else frozenset()
        return replace(self._subscription, stored=stored)

    def _generation(
        self, generation: int, owner_map: OwnerMap | None, error: str | None, assigned: frozenset[int]
    ) -> None:
        # kafka-python has applied the assignment already (positions of kept partitions kept, gained
        # partitions without one): seek what this member gained, then publish the view.
        with self._lock:
            gained = assigned - self._assigned
            self._assigned = assigned
        for partition in sorted(gained):
            offset = self._start_offset(partition) if self._start_offset is not None else 0
            self._consumer.seek(TopicPartition(self.topic, partition), int(offset))
        metadata = self._consumer.group_metadata()
        view = GroupView(
            generation=generation,
            member_id=str(metadata.member_id),
            assigned=assigned,
            owner_map=owner_map,
            error=error,
        )
        with self._lock:
            self._view = view
        if self._on_change is not None:
            self._on_change(view)

    def _lost(self) -> None:
        with self._lock:
            self._assigned = frozenset()
            self._view = None
        self._assignor.forget_held()
        if self._on_lost is not None:
            self._on_lost()

    # ------------------------------------------------------------------------------------- queries

    @property
    def view(self) -> GroupView | None:
        """The last generation this member took part in (``None`` before its first, or once dropped)."""
        with self._lock:
            return self._view

    @property
    def assigned(self) -> frozenset[int]:
        """The partitions this member fetches now."""
        with self._lock:
            return self._assigned

    # ------------------------------------------------------------------------------ the consumer

    def poll(self, timeout: float, max_records: int) -> dict[int, list[Any]]:
        """See ``FetchingConsumer.poll``; a join this poll left in flight is finished by the next one."""
        polled = super().poll(timeout, max_records)
        self._finish_interrupted_join()
        return polled

    def _finish_interrupted_join(self) -> None:
        # kafka-python 3.0.12 (the pinned range: >=3.0.12,<3.1): a JoinGroup/SyncGroup that outlasts a
        # poll stays in flight as the coordinator's ``_join_task`` for the next poll to await, but a
        # poll awaits it only while ``need_rejoin()``. A rejoin that a metadata change asked for (the
        # leader assigned from another partition set than the topic's now) is no longer "needed" once
        # the leader assigned inside that join: the join's result was never taken, the member stayed
        # REBALANCING with its heartbeat off, and the group went on without it for good. Asking for
        # the rejoin again makes the next poll await the join (or, when it ended unawaited, join
        # afresh). tests/integration/test_group.py pins this seam.
        coordinator = getattr(self._consumer, "_coordinator", None)
        if coordinator is None or getattr(coordinator, "_join_task", None) is None:
            return
        if not coordinator.need_rejoin():
            log.debug("group %s: a join left in flight by the last poll; the next poll finishes it", self.group)
            coordinator.request_rejoin()

    def seek(self, partition: int, offset: int) -> None:
        """Fetch ``partition`` (one this member holds) from ``offset`` on."""
        with self._errors:
            self._consumer.seek(TopicPartition(self.topic, partition), offset)

    def pause(self, partitions: Iterable[int]) -> None:
        """Fetch nothing of ``partitions`` (those of them kafka-python holds now) until ``resume``: the
        member goes on polling, heartbeating and rebalancing. kafka-python keeps the pause of a partition
        the member keeps across a rebalance; one it gains afresh starts unpaused."""
        self._pausing(partitions, resume=False)

    def resume(self, partitions: Iterable[int]) -> None:
        """Fetch ``partitions`` (those of them kafka-python holds now) again, from their positions."""
        self._pausing(partitions, resume=True)

    def _pausing(self, partitions: Iterable[int], *, resume: bool) -> None:
        wanted = {TopicPartition(self.topic, p) for p in partitions}
        if not wanted:
            return
        with self._errors:
            # kafka-python raises KeyError for a partition it does not hold (one taken away inside a poll).
            held = sorted(wanted & set(self._consumer.assignment()))
            if held:
                (self._consumer.resume if resume else self._consumer.pause)(*held)

    def position(self, partition: int) -> int | None:
        """The next offset the consumer fetches on ``partition``; ``None`` when kafka-python does not hold
        it right now (a rebalance began inside the last poll: eager revocation drops every partition
        before ``assigned`` hears of the next generation), where it would raise ``IllegalStateError``."""
        tp = TopicPartition(self.topic, partition)
        with self._errors:
            if tp not in self._consumer.assignment():
                return None
            position = self._consumer.position(tp)
        return None if position is None else int(position)

    def close(self) -> None:
        """Leave the group (the others rebalance at once) and close the connection."""
        with self._errors:
            self._consumer.close(autocommit=False)
