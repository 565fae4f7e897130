"""The range and pagination arithmetic of a read series (docs/spec.md#read-range, #pagination)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from throughline.core.cursor import Cursor
from throughline.core.exceptions import InvalidLimitError, PageTokenError
from throughline.core.page_range import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    PagePlan,
    RangeKind,
    ThroughBeforeAfter,
    plan_page,
    validate_limit,
)

P = b"p" * 32
A = b"a" * 32
B = b"b" * 32


def _cursor(source: bytes, length: int) -> Cursor:
    return Cursor(P, source, length, bytes([length % 256]) * 32, 0, length)


def _walk(after: Cursor | None, through: Cursor, limit: int) -> list[PagePlan]:
    """Follow a series page by page as a caller does, bounded in count."""
    pages = [plan_page(after, through, limit=limit, offset=None)]
    for _ in range(through.length + 2):
        if pages[-1].complete:
            return pages
        pages.append(plan_page(after, through, limit=limit, offset=pages[-1].next_offset))
    raise AssertionError("series did not complete")


# ---------------------------------------------------------------------------- docs/spec.md#read-limit


@pytest.mark.parametrize("limit", [1, 2, 10, 99, 100])
def test_limits_in_range(limit: int) -> None:
    assert validate_limit(limit) == limit


def test_default_limit() -> None:
    assert validate_limit(None) == DEFAULT_LIMIT == 10


@pytest.mark.parametrize("limit", [0, -1, 101, 10**9, True, False, 1.0, 10.5, "10", b"10", [10]])
def test_wrong_limit_is_a_hard_error(limit: object) -> None:
    with pytest.raises(InvalidLimitError) as info:
        validate_limit(limit)
    assert info.value.code == "invalid_limit"
    assert info.value.exit_code == 2


def test_plan_page_validates_limit() -> None:
    with pytest.raises(InvalidLimitError):
        plan_page(None, _cursor(A, 3), limit=0, offset=None)


# ------------------------------------------------------------------------------ docs/spec.md#snapshot


@given(st.integers(1, 500), st.integers(1, MAX_LIMIT))
def test_snapshot_is_the_latest_limit_turns_and_complete(length: int, limit: int) -> None:
    plan = plan_page(None, _cursor(A, length), limit=limit, offset=None)
    assert plan.kind is RangeKind.SNAPSHOT
    assert list(plan.seqs) == list(range(1, length + 1))[-limit:]
    assert plan.complete and plan.next_offset is None
    assert plan.history_truncated == (length > limit)
    assert plan.source_sha256 == A


@given(st.integers(1, 200), st.integers(1, MAX_LIMIT), st.integers(0, 300))
def test_snapshot_never_accepts_a_token_offset(length: int, limit: int, offset: int) -> None:
    with pytest.raises(PageTokenError) as info:
        plan_page(None, _cursor(A, length), limit=limit, offset=offset)
    assert info.value.code == "page_token_offset"


# ------------------------------------------------------------- docs/spec.md#read-range, #pagination


@given(st.integers(1, 400), st.integers(0, 400), st.integers(1, MAX_LIMIT))
def test_delta_pages_concatenate_to_exactly_the_range(through_len: int, after_len: int, limit: int) -> None:
    after_len = min(after_len, through_len)
    if after_len == 0:
        after_len = 1
    after, through = _cursor(A, after_len), _cursor(A, through_len)
    pages = _walk(after, through, limit)
    served = [seq for page in pages for seq in page.seqs]
    assert served == list(range(after_len + 1, through_len + 1))  # no gap, no duplicate, in order
    assert all(p.kind is RangeKind.DELTA and not p.history_truncated for p in pages)
    assert all(len(p.seqs) == limit for p in pages[:-1])
    assert 0 < len(pages[-1].seqs) <= limit or served == []
    assert [p.complete for p in pages] == [False] * (len(pages) - 1) + [True]
    # Paginate only when the range exceeds the limit.
    assert (len(pages) > 1) == (through_len - after_len > limit)


@given(st.integers(1, 400), st.integers(1, 400), st.integers(1, MAX_LIMIT))
def test_switch_pages_concatenate_to_the_new_source_from_zero(through_len: int, after_len: int, limit: int) -> None:
    pages = _walk(_cursor(A, after_len), _cursor(B, through_len), limit)
    served = [seq for page in pages for seq in page.seqs]
    assert served == list(range(1, through_len + 1))
    assert all(p.kind is RangeKind.SWITCH and p.source_sha256 == B for p in pages)
    assert all(p.range_start == 0 and p.range_end == through_len for p in pages)
    assert (len(pages) > 1) == (through_len > limit)


@given(st.integers(1, 300), st.integers(1, MAX_LIMIT))
def test_empty_delta_is_one_complete_page(length: int, limit: int) -> None:
    plan = plan_page(_cursor(A, length), _cursor(A, length), limit=limit, offset=None)
    assert list(plan.seqs) == []
    assert plan.complete and not plan.history_truncated


@given(st.integers(1, 300), st.integers(1, 300))
def test_through_before_after_on_the_same_source(a: int, b: int) -> None:
    after_len, through_len = max(a, b), min(a, b)
    if after_len == through_len:
        after_len += 1
    with pytest.raises(ThroughBeforeAfter):
        plan_page(_cursor(A, after_len), _cursor(A, through_len), limit=10, offset=None)


@given(st.integers(1, 300), st.integers(0, 300), st.integers(1, MAX_LIMIT), st.integers(0, 400))
def test_offset_past_the_range_is_a_hard_error(through_len: int, after_len: int, limit: int, offset: int) -> None:
    after_len = max(1, min(after_len, through_len))
    size = through_len - after_len
    after, through = _cursor(A, after_len), _cursor(A, through_len)
    if offset >= size:
        with pytest.raises(PageTokenError) as info:
            plan_page(after, through, limit=limit, offset=offset)
        assert info.value.code == "page_token_offset"
    else:
        plan = plan_page(after, through, limit=limit, offset=offset)
        assert plan.page_start == after_len + offset
        assert plan.page_end == min(through_len, after_len + offset + limit)


@given(st.integers(1, 300), st.integers(1, MAX_LIMIT), st.integers(0, 299))
def test_any_offset_inside_a_switch_range_plans_that_page(through_len: int, limit: int, offset: int) -> None:
    if offset >= through_len:
        with pytest.raises(PageTokenError):
            plan_page(_cursor(A, 1), _cursor(B, through_len), limit=limit, offset=offset)
        return
    plan = plan_page(_cursor(A, 1), _cursor(B, through_len), limit=limit, offset=offset)
    assert list(plan.seqs) == list(range(offset + 1, min(through_len, offset + limit) + 1))
    assert plan.complete == (offset + limit >= through_len)


def test_small_worked_example() -> None:
    after, through = _cursor(A, 3), _cursor(A, 28)
    pages = _walk(after, through, 10)
    assert [(p.page_start, p.page_end, p.next_offset) for p in pages] == [
        (3, 13, 10),
        (13, 23, 20),
        (23, 28, None),
    ]
