"""The one rule for a user's number of seconds: finite, >= 0, never a boolean."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from throughline.core.seconds import finite_seconds


@pytest.mark.parametrize("value", [0, 0.0, 1, 2.5, "0", "2.5", " 3 ", "1e3", 10**6])
def test_finite_non_negative_seconds_are_taken(value: object) -> None:
    assert finite_seconds(value) == float(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "value", [-1, -0.5, "-1", math.inf, -math.inf, math.nan, "inf", "nan", "", "soon", True, False, None, [1], b"1"]
)
def test_anything_else_is_refused(value: object) -> None:
    assert finite_seconds(value) is None


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_a_float_is_taken_exactly_when_finite_and_not_negative(value: float) -> None:
    expected = value if math.isfinite(value) and value >= 0 else None
    assert finite_seconds(value) == expected
    assert finite_seconds(repr(value)) == expected
