"""The token payload's exact shape, checked by hand in the pure core, agrees with a strict pydantic model.

The core may not import pydantic; the model it used to rely on is kept here as the reference.
"""

from __future__ import annotations

from typing import Any, Literal

from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from throughline.core.page_token import MAX_SAFE_INTEGER, SCHEMA, _payload_offset

HEX = "0123456789abcdef"


class Reference(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    schema_: Literal["throughline.observer_page.v1"] = Field(alias="schema")
    projectSha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    afterSha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    throughSha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    offset: int = Field(ge=0, le=MAX_SAFE_INTEGER)


def _accepted_by_reference(raw: Any) -> bool:
    try:
        Reference.model_validate(raw)
    except ValidationError:
        return False
    return True


hexes = st.one_of(
    st.text(HEX, min_size=64, max_size=64),
    st.text(HEX + "ABCDEF\n g", min_size=62, max_size=66),
    st.integers(),
    st.none(),
)
offsets = st.one_of(
    st.integers(-3, 3),
    st.integers(MAX_SAFE_INTEGER - 2, MAX_SAFE_INTEGER + 2),
    st.booleans(),
    st.floats(0, 10),
    st.text(max_size=3),
)
fields = st.fixed_dictionaries(
    {
        "schema": st.sampled_from([SCHEMA, "throughline.observer_page.v2", 1]),
        "projectSha256": hexes,
        "afterSha256": hexes,
        "throughSha256": hexes,
        "offset": offsets,
    }
)
payloads = st.one_of(
    fields,
    fields.flatmap(lambda d: st.sampled_from(sorted(d)).map(lambda k: {x: v for x, v in d.items() if x != k})),
    fields.map(lambda d: d | {"extra": 1}),
    st.lists(st.integers(), max_size=2),
)

GOOD = {"schema": SCHEMA, "projectSha256": "a" * 64, "afterSha256": "b" * 64, "throughSha256": "c" * 64, "offset": 7}


@given(payloads)
@example(GOOD)
@example(GOOD | {"offset": True})
@example(GOOD | {"offset": 7.0})
@example(GOOD | {"projectSha256": "a" * 64 + "\n"})
@example(GOOD | {"offset": MAX_SAFE_INTEGER + 1})
def test_the_hand_check_accepts_exactly_what_the_strict_model_accepts(raw: Any) -> None:
    assert (_payload_offset(raw) is not None) == _accepted_by_reference(raw)
