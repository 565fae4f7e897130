"""A ``serve --group`` member's read side (``throughline.serve.group``): which reads it answers itself and
which it forwards, over real loopback HTTP (the read API over a ``World``, scripted members)."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Iterator

import pytest
from reader_world import PROJECT, World
from served_app import Answer, ApiSettings, ScriptedServer, ServedApp, closed_url

from throughline.core.owner_map import GroupMember, OwnerMap
from throughline.log.group import GroupView
from throughline.serve import READ_PATH
from throughline.serve.forward import FORWARDED_HEADER
from throughline.serve.group import GroupRouter, Membership
from throughline.serve.transport import new_opener, send

ME = "http://127.0.0.1:9"  # this member's advertised URL (nothing listens: never forwarded to itself)
HOLDER_ANSWER = b'{"schema":"scripted","status":"ok"}'


def _view(holder_urls: list[str], *, mine: bool, generation: int = 1) -> GroupView:
    """One partition (the World has one); held by ``holder_urls`` and, when ``mine``, by this member."""
    urls = sorted({*holder_urls, ME} if mine else set(holder_urls) | {ME})
    members = tuple(GroupMember(url=u, member_id=f"id-{i}") for i, u in enumerate(urls))
    holders = {*holder_urls, ME} if mine else set(holder_urls)
    owners = ((tuple(i for i, m in enumerate(members) if m.url in holders)),)
    owner_map = OwnerMap(partitions=1, copies=len(owners[0]), members=members, owners=owners)
    me = next(m for m in members if m.url == ME)
    return GroupView(generation, me.member_id, frozenset({0}) if mine else frozenset(), owner_map)


class Member:
    """The read API of one member over ``world``, with its membership set by the test."""

    def __init__(self, world: World, *, generation_wait: float = 0.0) -> None:
        self.world = world
        self.membership = Membership("g", ME, None)
        with world.projection.view() as view:
            assert view is not None
        # The router's bounded wait is how long a read between generations waits for the next one.
        self.router = GroupRouter(self.membership, world.log, self._applied, read_wait=generation_wait)
        self.served = ServedApp(world, ApiSettings(read_wait=0.0), router=self.router)

    def _applied(self, partition: int) -> int:
        with self.world.projection.view() as view:
            return view.applied_offset(partition)

    def get(self, *, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        target = READ_PATH + "?" + urllib.parse.urlencode({"project": PROJECT, "limit": 2})
        return send(new_opener(), self.served.url, "GET", target, None, headers or {}, 10.0)

    def readyz(self) -> dict[str, object]:
        _, _, body = send(new_opener(), self.served.url, "GET", "/readyz", None, {}, 10.0)
        document: dict[str, object] = json.loads(body)
        return document


@pytest.fixture
def member(http_world: World) -> Iterator[Member]:
    m = Member(http_world)
    with m.served:
        yield m


@pytest.fixture
def holder() -> Iterator[ScriptedServer]:
    with ScriptedServer(
        Answer(200, HOLDER_ANSWER, {"Content-Type": "application/json", "Throughline-Reason": "r"})
    ) as s:
        yield s


def _local(member: Member) -> bytes:
    status, _, body = member.get(headers={FORWARDED_HEADER: "http://127.0.0.1:8"})  # answered here: one hop
    assert status == 200
    return body


def test_a_read_of_a_partition_it_does_not_hold_is_forwarded_and_answered_unchanged(
    member: Member, holder: ScriptedServer
) -> None:
    member.membership.on_change(_view([holder.url], mine=False))
    status, headers, body = member.get(headers={"Authorization": "Bearer shared-token"})
    assert (status, body, headers["throughline-reason"]) == (200, HOLDER_ANSWER, "r")
    (received,) = holder.received
    assert received.path.startswith(READ_PATH + "?") and "project=" in received.path
    _, _, metrics = send(new_opener(), member.served.url, "GET", "/metrics", None, {}, 10.0)
    assert 'throughline_reads_forwarded_total{code="200"} 1' in metrics.decode()
    assert received.headers[FORWARDED_HEADER.lower()] == ME
    assert received.headers["authorization"] == "Bearer shared-token"


def test_a_held_partition_it_has_caught_up_on_is_answered_here(member: Member, holder: ScriptedServer) -> None:
    member.membership.on_change(_view([holder.url], mine=True))
    status, _, body = member.get()
    assert status == 200 and body == _local(member) and json.loads(body)["status"] == "ok"
    assert holder.received == []
    assert member.membership.live() == {0}


def test_a_held_partition_still_catching_up_is_forwarded_until_it_has(member: Member, holder: ScriptedServer) -> None:
    member.world.append(apply=False)  # the log is ahead of this member's file
    member.membership.on_change(_view([holder.url], mine=True))
    assert member.get()[2] == HOLDER_ANSWER
    assert member.membership.live() == frozenset()
    member.world.project()  # caught up: answered here from now on, even while a little behind again
    assert member.get()[2] == _local(member)
    member.world.append(apply=False)
    status, _, body = member.get()
    assert json.loads(body)["status"] == "projection_pending" and len(holder.received) == 1


def test_losing_a_partition_ends_its_local_answers(member: Member, holder: ScriptedServer) -> None:
    member.membership.on_change(_view([holder.url], mine=True))
    assert member.get()[2] != HOLDER_ANSWER and member.membership.live() == {0}
    member.membership.on_change(_view([holder.url], mine=False, generation=2))
    assert member.membership.live() == frozenset()
    assert member.get()[2] == HOLDER_ANSWER  # its rows stay in the file, but are not served


def test_no_reachable_holder_is_503_forward_failed_for_a_partition_it_does_not_hold(member: Member) -> None:
    member.membership.on_change(_view([closed_url()], mine=False))
    status, _, body = member.get()
    assert status == 503 and json.loads(body)["error"]["code"] == "forward_failed"
    _, _, metrics = send(new_opener(), member.served.url, "GET", "/metrics", None, {}, 10.0)
    assert 'throughline_reads_forwarded_total{code="failed"} 1' in metrics.decode()


def test_no_reachable_holder_leaves_a_held_partition_answered_here_honestly(member: Member) -> None:
    member.world.append(apply=False)
    member.membership.on_change(_view([closed_url()], mine=True))
    status, _, body = member.get()
    assert status == 200 and json.loads(body)["status"] == "projection_pending"


def test_a_forwarded_read_is_never_forwarded_again(member: Member, holder: ScriptedServer) -> None:
    member.membership.on_change(_view([holder.url], mine=False))
    assert json.loads(_local(member))["status"] == "ok"
    assert holder.received == []


def test_readyz_shows_the_group_and_counts_only_held_lag(member: Member, holder: ScriptedServer) -> None:
    joining = member.readyz()
    assert joining["status"] == "not_ready" and joining["group"] == {
        "name": "g",
        "url": ME,
        "copies": None,
        "joined": False,
    }
    member.world.append(apply=False)
    member.membership.on_change(_view([holder.url], mine=False))
    report = member.readyz()
    assert report["status"] == "ready" and report["lag"] == 0  # the lagging partition is another's
    group = report["group"]
    assert isinstance(group, dict)
    assert group["held"] == [] and group["generation"] == 1 and group["heldLag"] == 0
    assert {m["url"] for m in group["members"]} == {ME, holder.url}
    assert report["partitions"] == [{"partition": 0, "appliedOffset": 3, "endOffset": 4, "lag": 1, "held": False}]
    member.membership.on_change(_view([holder.url], mine=True, generation=2))
    held = member.readyz()
    assert held["lag"] == 1 and held["group"]["catchingUp"] == [0] and held["group"]["heldLag"] == 1  # type: ignore[index]


def test_status_url_renders_the_group(member: Member, holder: ScriptedServer) -> None:
    from throughline.serve.remote_status import render_remote_status, status_document

    member.membership.on_change(_view([holder.url], mine=True))
    text = render_remote_status(status_document(member.served.url, 200, member.readyz()))
    assert "group g: generation 1, 2 copies; this member http://127.0.0.1:9 holds [0]" in text
    assert f"member {holder.url}: partitions [0]" in text
    assert text.splitlines()[-2].split() == ["partition", "applied", "end", "lag", "held"]
    assert text.splitlines()[-1].split() == ["0", "3", "3", "0", "yes"]


def test_a_member_dropped_from_the_group_holds_nothing_until_its_next_generation(
    member: Member, holder: ScriptedServer
) -> None:
    member.membership.on_change(_view([holder.url], mine=True))
    assert member.get()[2] != HOLDER_ANSWER and member.membership.live() == {0}
    member.membership.on_leave()  # session expired, or the projector's run ended
    assert member.membership.view is None and member.membership.live() == frozenset()
    assert member.readyz()["status"] == "not_ready"
    member.membership.on_change(_view([holder.url], mine=False, generation=2))
    assert member.get()[2] == HOLDER_ANSWER


def test_a_read_before_the_first_generation_waits_for_it_and_is_then_forwarded(
    http_world: World, holder: ScriptedServer
) -> None:
    m = Member(http_world, generation_wait=30.0)
    m.world.append(apply=False)  # a joining member's file is behind: answered here, it would be pending
    joins = threading.Timer(0.3, lambda: m.membership.on_change(_view([holder.url], mine=True)))
    with m.served:
        started = time.monotonic()
        joins.start()
        try:
            status, _, body = m.get()
        finally:
            joins.cancel()
        waited = time.monotonic() - started
    assert (status, body) == (200, HOLDER_ANSWER) and len(holder.received) == 1
    assert 0.2 < waited < 30.0  # it waited for the generation, not for its whole bound


def test_a_read_between_generations_is_answered_here_when_none_comes_in_time(
    http_world: World, holder: ScriptedServer
) -> None:
    m = Member(http_world, generation_wait=0.2)
    with m.served:
        m.membership.on_change(_view([holder.url], mine=True))
        m.membership.on_leave()  # dropped; no next generation within the wait
        status, _, body = m.get()
    assert status == 200 and json.loads(body)["status"] == "ok" and holder.received == []
