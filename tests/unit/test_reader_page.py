"""``read_observer_turn_page`` over the in-memory projection and log, one section per rule of docs/spec.md#read-contract."""

from __future__ import annotations

import base64
import dataclasses
import json
import threading

import pytest
from reader_world import KEY, OTHER_PROJECT, PROJECT, DoctoredProjection, World, replace, seqs
from support.wire import READ_FIELDS

from throughline.core.chain import content_digest
from throughline.core.cursor import Cursor, decode_cursor
from throughline.core.identity import project_sha256, source_sha256
from throughline.core.memory import BookProjection, FixedLog
from throughline.core.page_token import SeriesBinding, issue_page_token
from throughline.errors import InputError
from throughline.reader import (
    DEFAULT_BODY_LIMIT,
    ObserverRead,
    SourceQuarantinedError,
    TokenKeyError,
    read_observer_turn_page,
)


def _cursor(text: str | None) -> Cursor:
    decoded = decode_cursor(text)
    assert isinstance(decoded, Cursor)
    return decoded


def _code(world: World, **kwargs: object) -> str:
    with pytest.raises(InputError) as info:
        world.read(**kwargs)  # type: ignore[arg-type]
    assert info.value.exit_code == 2
    return info.value.code


@pytest.fixture
def world() -> World:
    return World()


# --------------------------------------------------------------------------- docs/spec.md#read-limit


@pytest.mark.parametrize("limit", [0, -1, 101, 1.5, 10.0, "10", True, [1]])
def test_wrong_limit_is_a_hard_error(world: World, limit: object) -> None:
    world.append_many(3)
    assert _code(world, limit=limit) == "invalid_limit"


def test_limit_default_is_ten(world: World) -> None:
    world.append_many(15)
    read = world.read(limit=None)
    assert [t.seq for t in read.turns] == list(range(6, 16))
    assert len(world.read().turns) == 10


def test_limit_bounds_are_accepted(world: World) -> None:
    world.append_many(120)
    assert len(world.read(limit=1).turns) == 1
    assert len(world.read(limit=100).turns) == 100


def test_invalid_project_is_a_hard_error(world: World) -> None:
    assert _code(world, project="") == "invalid_project"


# ------------------------------------------------------------------------ docs/spec.md#pinned-through


def test_empty_project_is_ok_with_no_through_and_a_complete_page(world: World) -> None:
    world.append(project=OTHER_PROJECT)
    read = world.read()
    assert read.status == "ok"
    assert read.turns == () and read.throughCursor is None and read.thread is None
    assert read.page.complete and read.page.nextToken is None
    assert not read.historyTruncated


def test_first_page_pins_the_head_as_the_log_holds_it(world: World) -> None:
    world.append_many(4)
    read = world.read()
    through = _cursor(read.throughCursor)
    assert through.length == 4 and through.offset == 3
    assert through.project_sha256 == project_sha256(PROJECT)
    assert read.thread is not None and read.thread.sourceSha256 == through.source_sha256.hex()


def test_turns_completed_mid_series_never_enter_it(world: World) -> None:
    world.append()
    after = world.series(limit=10)[-1].throughCursor
    world.append_many(25)  # the range at pin time is 25 turns
    extra: list[int] = []

    def more() -> None:
        world.append_many(3)
        extra.append(3)

    pages = world.series(after=after, limit=7, between_pages=more)
    assert len(pages) == 4 and extra == [3, 3, 3]
    assert seqs(pages) == list(range(2, 27))
    assert {p.throughCursor for p in pages} == {pages[0].throughCursor}
    assert _cursor(pages[0].throughCursor).length == 26
    # The next series picks up what completed meanwhile, without gap or duplicate.
    nxt = world.series(after=pages[0].throughCursor, limit=100)
    assert seqs(nxt) == list(range(27, 36))


def test_a_switch_mid_series_does_not_leak_into_it(world: World) -> None:
    world.append_many(3)
    after = world.read().throughCursor
    world.append_many(12)

    def switch() -> None:
        world.append(thread="thread-side")

    pages = world.series(after=after, limit=5, between_pages=switch)
    assert seqs(pages) == list(range(4, 16))
    assert all(p.thread == pages[0].thread for p in pages)


def test_first_page_waits_for_the_projector(world: World) -> None:
    world.append_many(3)
    world.append_many(2, apply=False)
    timer = threading.Timer(0.05, world.project)
    timer.start()
    try:
        read = world.read(wait_timeout=30.0)
    finally:
        timer.join()
    assert read.status == "ok" and [t.seq for t in read.turns] == [1, 2, 3, 4, 5]


# ------------------------------------------ the page token: docs/spec.md#page-tokens, #page-token-binding


def test_token_is_bound_to_the_exact_series(world: World) -> None:
    world.append_many(2)
    after = world.read().throughCursor
    world.append_many(25)
    page = world.read(after_cursor=after, limit=10)
    assert not page.page.complete and page.page.nextToken is not None
    token = page.page.nextToken
    payload = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    assert payload["offset"] == 10
    assert payload["projectSha256"] == project_sha256(PROJECT).hex()
    binding = SeriesBinding.of(project_sha256(PROJECT), after, page.throughCursor or "")
    assert payload["afterSha256"] == binding.after_sha256.hex()
    assert payload["throughSha256"] == binding.through_sha256.hex()


def _paginated(world: World) -> tuple[str, ObserverRead]:
    world.append_many(2)
    after = world.read().throughCursor
    assert after is not None
    world.append_many(25)
    return after, world.read(after_cursor=after, limit=10)


def test_token_without_cursors(world: World) -> None:
    after, page = _paginated(world)
    assert _code(world, page_token=page.page.nextToken) == "page_token_unbound"
    assert _code(world, after_cursor=after, page_token=page.page.nextToken) == "page_token_unbound"


def test_token_without_after_cursor(world: World) -> None:
    after, page = _paginated(world)
    code = _code(world, through_cursor=page.throughCursor, page_token=page.page.nextToken)
    assert code == "page_token_mismatch"


def test_token_for_another_project(world: World) -> None:
    after, page = _paginated(world)
    kwargs = dict(after_cursor=after, through_cursor=page.throughCursor, page_token=page.page.nextToken)
    # The token check comes before the cursors' project check (which would answer resync_required).
    assert _code(world, project=OTHER_PROJECT, **kwargs) == "page_token_mismatch"


def test_token_for_another_after(world: World) -> None:
    after, page = _paginated(world)
    other_after = world.read(through_cursor=after).throughCursor  # same cursor string: still the same
    assert other_after == after
    shorter = world.series(limit=1)[0].throughCursor
    assert shorter != after
    code = _code(world, after_cursor=shorter, through_cursor=page.throughCursor, page_token=page.page.nextToken)
    assert code == "page_token_mismatch"


def test_token_for_another_through(world: World) -> None:
    after, page = _paginated(world)
    world.append()
    newer = world.read().throughCursor
    code = _code(world, after_cursor=after, through_cursor=newer, page_token=page.page.nextToken)
    assert code == "page_token_mismatch"


def test_token_of_another_version(world: World) -> None:
    after, page = _paginated(world)
    token = page.page.nextToken
    assert token is not None and token.startswith("tlp1.")
    code = _code(world, after_cursor=after, through_cursor=page.throughCursor, page_token="tlp2." + token[5:])
    assert code == "page_token_version"


@pytest.mark.parametrize("position", [0, 4, 5, 40, 200, -44, -1])
def test_token_with_a_flipped_char(world: World, position: int) -> None:
    after, page = _paginated(world)
    token = page.page.nextToken
    assert token is not None
    i = position % len(token)
    flipped = token[:i] + ("B" if token[i] != "B" else "C") + token[i + 1 :]
    code = _code(world, after_cursor=after, through_cursor=page.throughCursor, page_token=flipped)
    assert code.startswith("page_token_")


def test_token_under_another_key(world: World) -> None:
    after, page = _paginated(world)
    with pytest.raises(InputError) as info:
        world.read(
            after_cursor=after,
            through_cursor=page.throughCursor,
            page_token=page.page.nextToken,
            token_key=bytes(32),
        )
    assert info.value.code == "page_token_tampered"


def test_oversize_token(world: World) -> None:
    after, page = _paginated(world)
    code = _code(world, after_cursor=after, through_cursor=page.throughCursor, page_token="tlp1." + "A" * 5000)
    assert code == "page_token_oversize"


def test_token_offset_past_the_range(world: World) -> None:
    after, page = _paginated(world)
    through = page.throughCursor
    assert through is not None
    binding = SeriesBinding.of(project_sha256(PROJECT), after, through)
    for offset in (25, 26, 10**6):
        forged = issue_page_token(KEY, binding, offset)  # a correctly keyed token with a wrong offset
        code = _code(world, after_cursor=after, through_cursor=through, page_token=forged)
        assert code == "page_token_offset"
    ok = world.read(after_cursor=after, through_cursor=through, page_token=issue_page_token(KEY, binding, 24))
    assert [t.seq for t in ok.turns] == [27]


def test_no_token_on_a_snapshot(world: World) -> None:
    world.append_many(30)
    read = world.read(limit=5)
    assert read.page.complete and read.page.nextToken is None
    binding = SeriesBinding.of(project_sha256(PROJECT), None, read.throughCursor or "")
    forged = issue_page_token(KEY, binding, 0)
    assert _code(world, through_cursor=read.throughCursor, page_token=forged) == "page_token_offset"


def test_token_errors_win_over_resync(world: World) -> None:
    after, page = _paginated(world)
    world.append(seq=1)  # rollback under both cursors: a plain read would be resync_required
    plain = world.read(after_cursor=after, through_cursor=page.throughCursor)
    assert plain.status == "resync_required"
    bad = (page.page.nextToken or "")[:-1] + "A"
    assert _code(world, after_cursor=after, through_cursor=page.throughCursor, page_token=bad).startswith("page_token")


def test_malformed_cursors_are_hard_errors(world: World) -> None:
    world.append()
    for field in ("after_cursor", "through_cursor"):
        for bad in ("", "tlc1.", "nonsense", "tlc1.AAAA\n", 5):
            assert _code(world, **{field: bad}) == "invalid_cursor"


def test_a_token_keeps_working_across_a_restart_with_the_same_key(world: World) -> None:
    after, page = _paginated(world)
    rebuilt = BookProjection()  # a replay into a fresh projection
    for record, partition, offset in _replay(world):
        rebuilt.apply(record, partition, offset)
    again = read_observer_turn_page(
        project=PROJECT,
        after_cursor=after,
        through_cursor=page.throughCursor,
        page_token=page.page.nextToken,
        projection=rebuilt,
        log=world.log,
        token_key=KEY,
        wait_timeout=0,
    )
    assert [t.seq for t in again.turns] == list(range(13, 23))


def _replay(world: World) -> list:
    # Rebuild the log order from the book (the in-memory log keeps no records once applied).
    turns = [t for chain in world.projection.book.live.values() for t in chain] + world.projection.book.superseded
    return sorted(((t.record, t.partition, t.offset) for t in turns), key=lambda x: x[2])


# ------------------------------------------------------------------ docs/spec.md#prefix-revalidation


def test_same_source_delta_is_after_to_through(world: World) -> None:
    world.append_many(4)
    after = world.read().throughCursor
    world.append_many(3)
    read = world.read(after_cursor=after)
    assert [t.seq for t in read.turns] == [5, 6, 7] and read.page.complete


def test_thread_switch_reads_the_new_thread_from_zero(world: World) -> None:
    world.append_many(4)
    after = world.read().throughCursor
    world.append_many(3, thread="thread-new")
    pages = world.series(after=after, limit=2)
    assert seqs(pages) == [1, 2, 3]
    new_source = source_sha256(project_sha256(PROJECT), "host-alpha", "thread-new")
    assert all(p.thread is not None and p.thread.sourceSha256 == new_source.hex() for p in pages)


def test_host_switch_reads_the_new_host_from_zero(world: World) -> None:
    world.append_many(4)
    world.append_many(2, host="host-beta")
    after = world.read().throughCursor
    world.append_many(3)  # back to host-alpha: the switch reads all five of its turns
    assert seqs(world.series(after=after, limit=10)) == [1, 2, 3, 4, 5, 6, 7]


def test_through_shorter_than_after_is_resync(world: World) -> None:
    world.append_many(3)
    short = world.read().throughCursor
    world.append_many(2)
    long = world.read().throughCursor
    read = world.read(after_cursor=long, through_cursor=short)
    assert read.status == "resync_required" and read.turns == () and read.page.nextToken is None


def test_rollback_under_the_after_cursor_is_resync(world: World) -> None:
    world.append_many(5)
    after = world.read().throughCursor
    world.append(seq=3)  # the thread is rewound to length 3
    read = world.read(after_cursor=after)
    assert read.status == "resync_required" and read.turns == ()
    assert read.afterCursor == after
    assert not read.page.complete and read.page.nextToken is None and not read.historyTruncated


def test_rollback_and_re_extension_under_the_after_cursor_is_resync(world: World) -> None:
    world.append_many(5)
    after = world.read().throughCursor
    world.append(seq=3)
    world.append_many(4)  # longer than before, but another chain
    assert _cursor(world.read().throughCursor).length == 7
    assert world.read(after_cursor=after).status == "resync_required"


def test_rollback_under_the_through_cursor_mid_series_is_resync(world: World) -> None:
    world.append_many(2)
    after = world.read().throughCursor
    world.append_many(20)
    first = world.read(after_cursor=after, limit=5)
    world.append(seq=10)
    nxt = world.read(after_cursor=after, through_cursor=first.throughCursor, page_token=first.page.nextToken, limit=5)
    assert nxt.status == "resync_required" and nxt.throughCursor == first.throughCursor


def test_vanished_source_is_resync(world: World) -> None:
    world.append_many(3)
    through = world.read().throughCursor
    fresh = World()
    fresh.append(thread="other")
    fresh.log.ends[0] = fresh.projection.applied[0] = 10
    assert fresh.read(through_cursor=through).status == "resync_required"
    assert fresh.read(after_cursor=through).status == "resync_required"


def test_after_cursor_for_a_project_with_no_turns_is_resync(world: World) -> None:
    world.append_many(3)
    after = world.read().throughCursor
    fresh = World()
    fresh.log.ends[0] = 5
    fresh.projection.applied[0] = 5
    assert fresh.read(after_cursor=after).status == "resync_required"


def test_cursor_of_another_project_is_resync(world: World) -> None:
    world.append_many(3, project=OTHER_PROJECT)
    world.append_many(3)
    other = world.read(project=OTHER_PROJECT).throughCursor
    assert world.read(after_cursor=other).status == "resync_required"
    assert world.read(through_cursor=other).status == "resync_required"


def test_cursor_of_another_version_is_resync(world: World) -> None:
    world.append_many(3)
    current = world.read().throughCursor or ""
    foreign = "tlc2." + current[5:]
    for kwargs in ({"after_cursor": foreign}, {"through_cursor": foreign}):
        read = world.read(**kwargs)
        assert read.status == "resync_required" and read.turns == ()


def test_cursor_on_another_partition_is_resync() -> None:
    world = World(partitions=8)
    world.append_many(3)
    c = _cursor(world.read().throughCursor)
    moved = Cursor(c.project_sha256, c.source_sha256, c.length, c.chain_digest, (c.partition + 1) % 8, c.offset)
    assert world.read(after_cursor=moved.encode()).status == "resync_required"


def test_cursor_past_the_log_end_is_resync(world: World) -> None:
    world.append_many(3)
    c = _cursor(world.read().throughCursor)
    ahead = Cursor(c.project_sha256, c.source_sha256, c.length, c.chain_digest, c.partition, 50)
    assert world.read(through_cursor=ahead.encode()).status == "resync_required"


def test_forged_cursor_with_another_digest_is_resync(world: World) -> None:
    world.append_many(3)
    c = _cursor(world.read().throughCursor)
    forged = Cursor(c.project_sha256, c.source_sha256, c.length, b"\x01" * 32, c.partition, c.offset)
    assert world.read(after_cursor=forged.encode()).status == "resync_required"


def test_quarantined_source_is_a_hard_failure(world: World) -> None:
    world.append_many(3)
    world.append(seq=9)  # a gap: quarantined, the source is marked broken
    with pytest.raises(SourceQuarantinedError) as info:
        world.read()
    assert info.value.code == "source_quarantined" and info.value.exit_code == 1
    assert "host-alpha" not in info.value.message and "thread-main" not in info.value.message


# ----------------------------------------------------------------------------- docs/spec.md#snapshot


def test_snapshot_is_the_latest_limit_turns(world: World) -> None:
    world.append_many(23)
    read = world.read(limit=5)
    assert [t.seq for t in read.turns] == [19, 20, 21, 22, 23]
    assert read.historyTruncated and read.page.complete and read.page.nextToken is None


def test_snapshot_without_older_turns_is_not_truncated(world: World) -> None:
    world.append_many(5)
    read = world.read(limit=5)
    assert [t.seq for t in read.turns] == [1, 2, 3, 4, 5] and not read.historyTruncated


def test_snapshot_of_a_given_through(world: World) -> None:
    world.append_many(8)
    through = world.read().throughCursor
    world.append_many(8)
    read = world.read(through_cursor=through, limit=3)
    assert [t.seq for t in read.turns] == [6, 7, 8] and read.throughCursor == through


# ---------------------------------------------------------------------------- docs/spec.md#pagination


def test_delta_paginates_only_beyond_the_limit(world: World) -> None:
    world.append_many(2)
    after = world.read().throughCursor
    world.append_many(10)
    one = world.series(after=after, limit=10)
    assert len(one) == 1 and one[0].page.complete and seqs(one) == list(range(3, 13))
    world.append_many(1)
    two = world.series(after=after, limit=10)
    assert [p.page.complete for p in two] == [False, True] and seqs(two) == list(range(3, 14))
    assert two[-1].page.nextToken is None


def test_empty_delta_is_a_complete_page(world: World) -> None:
    world.append_many(3)
    after = world.read().throughCursor
    read = world.read(after_cursor=after)
    assert read.status == "ok" and read.turns == () and read.page.complete and read.page.nextToken is None
    assert read.throughCursor == after


def test_pages_may_be_read_again_in_any_order(world: World) -> None:
    world.append_many(1)
    after = world.read().throughCursor
    world.append_many(30)
    pages = world.series(after=after, limit=7)
    again = world.read(
        after_cursor=after, through_cursor=pages[0].throughCursor, page_token=pages[2].page.nextToken, limit=7
    )
    assert again == pages[3]


# -------------------------------------------------------------------- docs/spec.md#projection-pending


def test_ingest_without_projecting_is_pending_then_ok(world: World) -> None:
    world.append_many(3)
    world.append_many(2, apply=False)
    read = world.read()
    assert read.status == "projection_pending"
    assert read.turns == () and read.throughCursor is None and read.page.nextToken is None
    assert not read.page.complete and read.reason
    world.project()
    ok = world.read()
    assert ok.status == "ok" and [t.seq for t in ok.turns] == [1, 2, 3, 4, 5]


def test_pending_for_another_project_on_the_same_partition(world: World) -> None:
    # The reader cannot tell whose records are unapplied, so it waits for all of the partition.
    world.append_many(3)
    world.append(project=OTHER_PROJECT, apply=False)
    assert world.read().status == "projection_pending"


def test_a_lagging_projection_is_pending_for_a_later_page(world: World) -> None:
    world.append_many(2)
    after = world.read().throughCursor
    world.append_many(20)
    first = world.read(after_cursor=after, limit=5)
    lagging = BookProjection()
    for record, partition, offset in _replay(world)[:10]:
        lagging.apply(record, partition, offset)
    read = world.read(
        after_cursor=after,
        through_cursor=first.throughCursor,
        page_token=first.page.nextToken,
        limit=5,
        projection=lagging,
    )
    assert read.status == "projection_pending" and read.turns == ()
    assert read.throughCursor == first.throughCursor and read.afterCursor == after


@pytest.mark.parametrize(
    "doctor",
    [
        pytest.param(lambda r: None if r.seq == 7 else r, id="missing-row"),
        pytest.param(lambda r: replace(r, body=r.body + "!") if r.seq == 7 else r, id="other-body"),
        pytest.param(lambda r: replace(r, content_digest=b"\0" * 32) if r.seq == 7 else r, id="content-digest"),
        pytest.param(lambda r: replace(r, chain_digest=b"\0" * 32) if r.seq == 7 else r, id="chain-digest"),
        pytest.param(lambda r: replace(r, seq=r.seq + 1) if r.seq == 7 else r, id="wrong-seq"),
        pytest.param(lambda r: replace(r, body_bytes=1) if r.seq == 7 else r, id="body-bytes"),
    ],
)
def test_a_page_the_projection_lacks_or_disagrees_with_is_pending(world: World, doctor) -> None:
    world.append_many(4)
    after = world.read().throughCursor
    world.append_many(6)
    read = world.read(after_cursor=after, projection=DoctoredProjection(world.projection, doctor))
    assert read.status == "projection_pending"
    assert read.turns == () and read.page.nextToken is None and not read.page.complete


def test_a_wrong_link_row_before_the_page_is_pending(world: World) -> None:
    world.append_many(10)
    doctored = DoctoredProjection(world.projection, lambda r: replace(r, chain_digest=b"\0" * 32) if r.seq == 7 else r)
    read = world.read(limit=3, projection=doctored)
    assert read.status == "projection_pending" and read.turns == ()
    assert world.read(limit=3).status == "ok"


def test_a_cursor_row_with_another_chain_digest_is_resync(world: World) -> None:
    world.append_many(4)
    after = world.read().throughCursor
    world.append_many(6)
    doctored = DoctoredProjection(world.projection, lambda r: replace(r, chain_digest=b"\0" * 32) if r.seq == 4 else r)
    assert world.read(after_cursor=after, projection=doctored).status == "resync_required"


def test_a_snapshot_with_a_consistent_but_wrong_last_row_is_pending(world: World) -> None:
    world.append_many(3)
    through = world.read().throughCursor

    def doctor(row):  # a self-consistent row 3 with another body: its chain no longer ends at through
        if row.seq != 3:
            return row
        from throughline.core.chain import next_chain_digest

        digest = content_digest(row.turn_id, row.completed_at_micros, "forged")
        prev = world.projection.book.live[row_source(world)][1].chain_digest
        return replace(
            row,
            body="forged",
            body_bytes=6,
            content_digest=digest,
            chain_digest=next_chain_digest(prev, digest),
        )

    read = world.read(through_cursor=through, projection=DoctoredProjection(world.projection, doctor))
    # The through row itself disagrees with the cursor: the cursor's chain was not found (resync), or the
    # page does not end at the cursor (pending); either way no turns are served.
    assert read.status in ("projection_pending", "resync_required") and read.turns == ()


def row_source(world: World) -> bytes:
    return source_sha256(project_sha256(PROJECT), "host-alpha", "thread-main")


def test_missing_cursor_row_is_pending(world: World) -> None:
    world.append_many(5)
    after = world.read().throughCursor
    read = world.read(after_cursor=after, projection=DoctoredProjection(world.projection, lambda r: None))
    assert read.status == "projection_pending" and read.turns == ()


# ---------------------------------------------------------------------------- docs/spec.md#read-wire


def test_wire_fields_are_exactly_the_adr_fields(world: World) -> None:
    world.append_many(3)
    doc = json.loads(world.read().to_json())
    assert set(doc) == READ_FIELDS
    assert doc["schema"] == "throughline.observer_read.v1"
    assert set(doc["thread"]) == {"sourceSha256"}
    assert set(doc["page"]) == {"complete", "nextToken"}
    assert set(doc["turns"][0]) == {
        "seq",
        "completedAt",
        "body",
        "bodyBytes",
        "bodyTruncated",
        "contentDigest",
        "chainDigest",
    }
    assert doc["turns"][0]["completedAt"] == "2026-05-28T20:26:40.001000Z"
    assert ObserverRead.from_json(json.dumps(doc)) == world.read()


def test_pending_reason_stays_off_the_wire(world: World) -> None:
    world.append(apply=False)
    read = world.read()
    assert read.reason and "reason" not in json.loads(read.to_json())


def test_turn_records_carry_digests(world: World) -> None:
    records = world.append_many(3)
    read = world.read()
    for record, turn in zip(records, read.turns, strict=True):
        assert turn.contentDigest == record.content_digest.hex()
        assert turn.body == record.body and turn.bodyBytes == len(record.body.encode())
        assert not turn.bodyTruncated
    assert read.turns[-1].chainDigest == _cursor(read.throughCursor).chain_digest.hex()


def test_a_long_body_is_cut_but_keeps_its_record(world: World) -> None:
    long = "é" * 40_000  # 80,000 bytes
    record = world.append(body=long)
    world.append(body="short")
    read = world.read()
    cut = read.turns[0]
    assert cut.bodyTruncated and cut.bodyBytes == 80_000
    assert len(cut.body.encode()) == DEFAULT_BODY_LIMIT and cut.body == "é" * (DEFAULT_BODY_LIMIT // 2)
    assert cut.contentDigest == record.content_digest.hex()
    assert [t.seq for t in read.turns] == [1, 2] and not read.turns[1].bodyTruncated


def test_body_limit_is_configurable(world: World) -> None:
    world.append(body="a€b")  # 1 + 3 + 1 bytes
    assert world.read(body_limit=2).turns[0].body == "a"
    assert world.read(body_limit=4).turns[0].body == "a€"
    assert world.read(body_limit=5).turns[0].bodyTruncated is False
    zero = world.read(body_limit=0).turns[0]
    assert zero.body == "" and zero.bodyTruncated and zero.bodyBytes == 5


@pytest.mark.parametrize("body_limit", [-1, 1.5, "10", True, None])
def test_wrong_body_limit_is_a_hard_error(world: World, body_limit: object) -> None:
    world.append()
    assert _code(world, body_limit=body_limit) == "invalid_body_limit"


@pytest.mark.parametrize("wait", [-1, float("nan"), float("inf"), "1", None])
def test_wrong_wait_is_a_hard_error(world: World, wait: object) -> None:
    assert _code(world, wait_timeout=wait) == "invalid_wait"


def test_a_short_token_key_is_refused(world: World) -> None:
    world.append()
    with pytest.raises(TokenKeyError):
        world.read(token_key=b"short")


def test_nothing_raw_on_the_wire(world: World) -> None:
    world.append_many(3, body="visible body")
    world.append_many(2, project=OTHER_PROJECT, host="host-secret", thread="thread-secret", body="hidden body")
    docs = [world.read(limit=2).to_json()]
    after = world.read(limit=1).throughCursor
    world.append_many(25, thread="thread-two")
    docs += [p.to_json() for p in world.series(after=after, limit=10)]
    for doc in docs:
        for raw in (
            "alice",
            "ledger-secret",
            "host-alpha",
            "thread-main",
            "thread-two",
            "turn-id",
            "hidden",
            "bob",
        ):
            assert raw not in doc


def test_all_rows_of_a_page_come_from_one_view() -> None:
    calls: list[str] = []

    class Counting(BookProjection):
        def view(self):  # type: ignore[override]
            calls.append("view")
            return super().view()

    world = World(projection=Counting())
    world.append_many(30)
    world.read(limit=100)
    assert calls == ["view"]


def test_read_with_an_unknown_partition_count_log() -> None:
    log = FixedLog(partitions=3)
    projection = BookProjection()
    read = read_observer_turn_page(project=PROJECT, projection=projection, log=log, token_key=KEY, wait_timeout=0)
    assert read.status == "ok" and read.throughCursor is None


def test_the_limit_may_change_between_pages_without_gap_or_duplicate(world: World) -> None:
    world.append()
    after = world.read().throughCursor
    world.append_many(40)
    page = world.read(after_cursor=after, limit=7)
    served = [t.seq for t in page.turns]
    for limit in (3, 11, 1, 100):
        if page.page.complete:
            break
        page = world.read(
            after_cursor=after, through_cursor=page.throughCursor, page_token=page.page.nextToken, limit=limit
        )
        served += [t.seq for t in page.turns]
    assert page.page.complete and served == list(range(2, 42))


def test_a_cursor_naming_the_end_offset_itself_is_resync(world: World) -> None:
    """The end offset is where the NEXT record will go: no record of this log sits there, so a cursor
    naming it came from another log (a recreated topic) and is ``resync_required``, not waited for;
    the offset just below it (the last record) is this log's."""
    world.append_many(3)
    last = _cursor(world.read().throughCursor)
    end = world.log.ends[0]
    assert last.offset == end - 1
    assert world.read(after_cursor=last.encode()).status == "ok"
    assert world.read(through_cursor=last.encode()).status == "ok"
    at_end = dataclasses.replace(last, offset=end).encode()
    for cursor in ({"after_cursor": at_end}, {"through_cursor": at_end}):
        answer = world.read(**cursor)
        assert answer.status == "resync_required", answer.reason
        assert answer.reason is not None and "does not hold" in answer.reason
