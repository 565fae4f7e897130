"""``OwnerAssignor`` without a broker: what it puts on the wire of Kafka's consumer protocol, and how the
leader treats members it cannot read (the integration tests run it in a real group)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kafka.coordinator.assignors.abstract import ConsumerProtocolAssignment, ConsumerProtocolSubscription

from throughline.core.owner_map import MemberSubscription, OwnerMap
from throughline.log.group import PROTOCOL_NAME, OwnerAssignor

TOPIC = "throughline.turns"


class _Cluster:
    def __init__(self, partitions: int) -> None:
        self.partitions = partitions

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return set(range(self.partitions)) if topic == TOPIC else None


def _member(member_id: str, subscription: ConsumerProtocolSubscription) -> Any:
    # What kafka-python's coordinator hands assign(): the JoinGroup member with its decoded metadata.
    wire = subscription.encode()
    return SimpleNamespace(
        member_id=member_id, group_instance_id=None, metadata=ConsumerProtocolSubscription.decode(wire)
    )


def _assignor(
    url: str, stored: frozenset[int] = frozenset(), copies: int | None = None
) -> tuple[OwnerAssignor, list[tuple]]:
    seen: list[tuple] = []
    assignor = OwnerAssignor(
        TOPIC,
        lambda: MemberSubscription(url=url, stored=stored, copies=copies),
        lambda *args: seen.append(args),
    )
    return assignor, seen


def test_the_subscription_carries_the_member_and_what_it_held() -> None:
    assignor, _ = _assignor("http://127.0.0.1:8001", stored=frozenset({1, 4}), copies=3)
    assert assignor.name == PROTOCOL_NAME
    first = ConsumerProtocolSubscription.decode(assignor.metadata({TOPIC}).encode())
    assert list(first.topics) == [TOPIC]
    offer = MemberSubscription.decode(bytes(first.user_data))
    assert offer == MemberSubscription(url="http://127.0.0.1:8001", stored=frozenset({1, 4}), copies=3)
    assignor.on_assignment(ConsumerProtocolAssignment(0, [(TOPIC, [0, 2])], b"not a map"), 7)
    again = MemberSubscription.decode(bytes(assignor.metadata({TOPIC}).user_data))
    assert again.held == frozenset({0, 2})
    assignor.forget_held()
    assert MemberSubscription.decode(bytes(assignor.metadata({TOPIC}).user_data)).held == frozenset()


def test_the_leader_hands_every_member_its_partitions_and_the_whole_map() -> None:
    assignors = [_assignor(f"http://127.0.0.1:800{i}") for i in range(3)]
    members = [_member(f"member-{i}", a.metadata({TOPIC})) for i, (a, _) in enumerate(assignors)]
    leader = assignors[0][0]
    result = leader.assign(_Cluster(6), members)
    assert set(result) == {"member-0", "member-1", "member-2"}
    maps = {bytes(a.user_data) for a in result.values()}
    assert len(maps) == 1
    owner_map = OwnerMap.decode(maps.pop())
    for member_id, assignment in result.items():
        decoded = ConsumerProtocolAssignment.decode(assignment.encode())
        assert {tp.partition for tp in decoded.partitions()} == owner_map.partitions_of(member_id)
    # Every member learns the map from its own assignment.
    for i, (assignor, seen) in enumerate(assignors):
        assignor.on_assignment(ConsumerProtocolAssignment.decode(result[f"member-{i}"].encode()), 3)
        generation, got, error, assigned = seen[-1]
        assert (generation, got, error) == (3, owner_map, None)
        assert assigned == owner_map.partitions_of(f"member-{i}")


def test_a_member_the_leader_cannot_read_gets_nothing_but_the_map() -> None:
    good, _ = _assignor("http://127.0.0.1:8001")
    members = [
        _member("good", good.metadata({TOPIC})),
        _member("garbage", ConsumerProtocolSubscription(version=0, topics=[TOPIC], user_data=b"\x00\x01")),
        _member(
            "newer",
            ConsumerProtocolSubscription(
                version=0, topics=[TOPIC], user_data=b'{"schema":"throughline.group_member.v2"}'
            ),
        ),
        _member(
            "elsewhere",
            ConsumerProtocolSubscription(version=0, topics=["other"], user_data=good.metadata({TOPIC}).user_data),
        ),
    ]
    result = good.assign(_Cluster(3), members)
    owner_map = OwnerMap.decode(bytes(result["good"].user_data))
    assert [m.member_id for m in owner_map.members] == ["good"]
    assert owner_map.partitions_of("good") == frozenset({0, 1, 2})
    for member_id in ("garbage", "newer", "elsewhere"):
        assert ConsumerProtocolAssignment.decode(result[member_id].encode()).partitions() == []
        assert bytes(result[member_id].user_data) == bytes(result["good"].user_data)


def test_a_topic_without_metadata_gives_an_empty_map() -> None:
    assignor, _ = _assignor("http://127.0.0.1:8001")
    result = assignor.assign(_Cluster(0), [_member("m", assignor.metadata({TOPIC}))])
    assert OwnerMap.decode(bytes(result["m"].user_data)).partitions == 0


def test_a_map_the_member_cannot_read_is_reported_with_the_partitions_kafka_gave() -> None:
    assignor, seen = _assignor("http://127.0.0.1:8001")
    assignor.on_assignment(
        ConsumerProtocolAssignment(0, [(TOPIC, [1]), ("other", [0])], b'{"schema":"throughline.owner_map.v9"}'), 4
    )
    generation, owner_map, error, assigned = seen[-1]
    assert (generation, owner_map, assigned) == (4, None, frozenset({1}))
    assert error is not None and error.startswith("group_data_version")


def test_the_coordinator_refusing_a_member_is_a_typed_setting_error() -> None:
    import kafka.errors as kafka_errors

    from throughline.log import GroupRefusedError, translate_kafka_error

    cases = [
        (kafka_errors.InconsistentGroupProtocolError(), "group_protocol_mismatch"),
        (kafka_errors.InvalidSessionTimeoutError(), "invalid_session_timeout"),
        (kafka_errors.GroupMaxSizeReachedError(), "group_full"),
    ]
    for exc, code in cases:
        error = translate_kafka_error(exc, ["127.0.0.1:9092"])
        assert isinstance(error, GroupRefusedError)
        assert (error.code, error.exit_code, error.retriable) == (code, 2, False)
