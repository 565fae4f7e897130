"""Prepare (decode and check one partition's records) and the frame it crosses processes in."""

from __future__ import annotations

import dataclasses
import gc
import pickle
import sys
import threading

from hypothesis import given, settings
from hypothesis import strategies as st
from support.world import BASE_MICROS, numbered_turn

from throughline.core.fold import record_problem
from throughline.core.identity import canonical_project, project_sha256
from throughline.projector.feed.frames import dumps
from throughline.projector.prepare import (
    Q_INVALID,
    Q_MISPLACED,
    Q_UNDECODABLE,
    LogRecord,
    PreparedBatch,
    RefusedRecord,
    SoundRecord,
    check_content,
    prepare_batch,
)
from throughline.runtime import fewer_gc_passes, prompt_gil_handoffs
from throughline.schemas.codec import decode_turn, encode_turn


def _turn(i: int, project: str = "/p/a", body: str = "body") -> bytes:
    """The encoded ``i``-th turn of one source (``support.world.numbered_turn``)."""
    return encode_turn(numbered_turn(i, project, "h", "t", body=body, id_prefix="id-"))


_values = st.one_of(
    st.integers(0, 50).map(_turn),
    st.integers(0, 50).map(lambda i: _turn(i, body="ünïcödé ✓ " * 3)),
    st.binary(max_size=40),  # undecodable
    st.none(),  # a tombstone
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_values, max_size=30), st.integers(0, 5))
def test_a_prepared_batch_survives_the_frame_unchanged(values: list[bytes | None], extra: int) -> None:
    records = [LogRecord(0, i * 2, None, v) for i, v in enumerate(values)]
    batch = prepare_batch(0, records, partitions=1, next_offset=len(values) * 2 + extra)
    again = pickle.loads(dumps(batch))
    assert again == batch
    assert [type(it) for it in again.items] == [type(it) for it in batch.items]


def test_a_sound_record_carries_what_the_turn_says() -> None:
    value = _turn(7, body="héllo")
    turn = decode_turn(value)
    (item,) = prepare_batch(3, [LogRecord(3, 9, turn.project_sha256, value)]).items
    assert isinstance(item, SoundRecord)
    assert (item.offset, item.key, item.value) == (9, turn.project_sha256, value)
    assert item.source == turn.source_sha256 and item.project_sha256 == turn.project_sha256
    assert (item.turn_id, item.seq, item.completed_at_micros, item.body) == ("id-7", None, BASE_MICROS + 7_000, "héllo")
    assert item.body_bytes == len("héllo".encode()) and item.content_digest == turn.content_digest


def test_refusals_agree_with_record_problem_and_keep_the_bytes() -> None:
    good = _turn(1)
    turn = decode_turn(good)
    other_key = b"\x01" * 32
    batch = prepare_batch(
        0,
        [
            LogRecord(0, 0, other_key, good),  # another project's key
            LogRecord(0, 1, None, b"\xc3\x01garbage"),
            LogRecord(0, 2, None, None),
        ],
    )
    wrong_key, garbage, tombstone = batch.items
    assert isinstance(wrong_key, RefusedRecord) and wrong_key.code == Q_INVALID
    assert wrong_key.reason == record_problem(turn, other_key)
    assert (wrong_key.project_sha256, wrong_key.source, wrong_key.value) == (
        turn.project_sha256,
        turn.source_sha256,
        good,
    )
    assert isinstance(garbage, RefusedRecord) and garbage.value == b"\xc3\x01garbage"
    assert isinstance(tombstone, RefusedRecord) and tombstone.code == Q_UNDECODABLE


def test_a_record_on_another_partition_than_its_project_is_misplaced() -> None:
    value = _turn(1)
    batches = [prepare_batch(p, [LogRecord(p, 0, None, value)], partitions=2) for p in (0, 1)]
    codes = sorted(type(b.items[0]).__name__ + ":" + getattr(b.items[0], "code", "") for b in batches)
    assert codes == ["RefusedRecord:" + Q_MISPLACED, "SoundRecord:"]


def test_an_offset_only_batch_frames_too() -> None:
    batch = prepare_batch(2, [], next_offset=40)
    assert pickle.loads(dumps(batch)) == PreparedBatch(2, (), 40)


def test_fewer_gc_passes_raises_the_threshold_and_restores_it() -> None:
    before = gc.get_threshold()
    with fewer_gc_passes(before[0] + 1000):
        assert gc.get_threshold()[0] == before[0] + 1000
    assert gc.get_threshold() == before
    with fewer_gc_passes(None):
        assert gc.get_threshold() == before
    with fewer_gc_passes(1):  # never lowers it
        assert gc.get_threshold() == before


def test_prompt_gil_handoffs_lowers_the_switch_interval_and_restores_it() -> None:
    before = sys.getswitchinterval()
    with prompt_gil_handoffs(before / 10):
        assert sys.getswitchinterval() == before / 10
    assert sys.getswitchinterval() == before
    with prompt_gil_handoffs(None):
        assert sys.getswitchinterval() == before
    with prompt_gil_handoffs(before * 10):  # never raises it
        assert sys.getswitchinterval() == before


def test_overlapping_blocks_keep_the_settings_until_the_last_one_ends() -> None:
    # serve's rebuild: the old live run ends while the new file's run goes on (on another thread).
    threshold, interval = gc.get_threshold(), sys.getswitchinterval()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with fewer_gc_passes(threshold[0] + 1000), prompt_gil_handoffs(interval / 10):
            first_in.set()
            assert second_in.wait(10)
        first_out.set()

    thread = threading.Thread(target=first)
    thread.start()
    assert first_in.wait(10)
    with fewer_gc_passes(threshold[0] + 1000), prompt_gil_handoffs(interval / 10):
        second_in.set()
        assert first_out.wait(10)
        assert gc.get_threshold()[0] == threshold[0] + 1000 and sys.getswitchinterval() == interval / 10
    thread.join(10)
    assert gc.get_threshold() == threshold and sys.getswitchinterval() == interval


def test_throughline_errors_cross_the_worker_boundary_unchanged() -> None:
    from throughline.log.exceptions import BrokerUnavailableError, LossyTopicError
    from throughline.projector.exceptions import FetchWorkerError

    for error in (
        BrokerUnavailableError(["127.0.0.1:9"], "no answer"),
        LossyTopicError("t", ["retention.ms=1"]),
        FetchWorkerError("gone", retriable=False),
    ):
        again = pickle.loads(dumps(error))
        assert type(again) is type(error)
        assert (again.code, again.message, again.retriable, str(again)) == (
            error.code,
            error.message,
            error.retriable,
            str(error),
        )
    assert pickle.loads(dumps(BrokerUnavailableError(["a:1"], "x"))).servers == ("a:1",)


def _tampered(i: int, project: str = "/p/a") -> bytes:
    """A turn whose content digest is not its content's."""
    turn = numbered_turn(i, project, "h", "t", body="body", id_prefix="id-")
    return encode_turn(dataclasses.replace(turn, content_digest=bytes(32)))


_PROJECTS = ("/p/a", "/p/b", "/p/c", "/p/d")


def _value(kind: str, i: int, project: str) -> bytes | None:
    if kind == "good":
        return _turn(i, project)
    if kind == "tampered":
        return _tampered(i, project)
    return b"\xc3\x01garbage" if kind == "garbage" else None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(("good", "tampered", "garbage", "tombstone")),
            st.integers(0, 20),
            st.sampled_from(_PROJECTS),
            st.sampled_from(("own", "none", "other")),  # the record's key
        ),
        max_size=25,
    ),
    st.sampled_from((None, 2)),
)
def test_a_deferred_content_check_refuses_what_the_whole_check_refuses(
    specs: list[tuple[str, int, str, str]], partitions: int | None
) -> None:
    """The fetch worker's split (``defer_content``, then ``check_content`` in the parent) refuses the
    same records with the same codes and reasons, also where a record has a second problem that ranks
    below the digest (another project's key, another partition)."""
    records = []
    for offset, (kind, i, project, key_kind) in enumerate(specs):
        value = _value(kind, i, project)
        own = project_sha256(canonical_project(project))
        key = {"own": own, "none": None, "other": b"\x01" * 32}[key_kind]
        records.append(LogRecord(0, offset, key, value))
    whole = prepare_batch(0, records, partitions=partitions)
    deferred = prepare_batch(0, records, partitions=partitions, defer_content=True)
    assert check_content(deferred) == whole
    assert check_content(pickle.loads(dumps(deferred))) == whole  # as it crosses from the worker


def test_a_deferred_batch_leaves_a_tampered_record_sound_until_checked() -> None:
    """The control: without ``check_content`` the deferred batch would let the record through."""
    (item,) = prepare_batch(0, [LogRecord(0, 0, None, _tampered(1))], defer_content=True).items
    assert isinstance(item, SoundRecord)
    (checked,) = check_content(PreparedBatch(0, (item,), 1)).items
    assert isinstance(checked, RefusedRecord) and checked.code == Q_INVALID
    assert checked.reason == "contentDigest does not match the turn's content"
    assert (checked.source, checked.project_sha256, checked.value) == (item.source, item.project_sha256, item.value)
