"""``ReadRequest``: the one read request of the library, the CLI and the HTTP API.

Its numbers are validated where it is made (``limit`` 1..100, ``wait`` finite seconds >= 0); the wire
names the HTTP API parses and documents are exactly its fields; a request the client sends is parsed
back by the server into the same value.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from throughline.core.exceptions import InvalidLimitError
from throughline.reader import ReadRequest
from throughline.reader.exceptions import InvalidWaitError
from throughline.serve.client import request_body
from throughline.serve.openapi import ReadRequestBody
from throughline.serve.params import FIELD_OF, request_from_json, request_from_query


def test_limit_defaults_and_is_checked_once_made() -> None:
    assert ReadRequest(project="p").limit == 10
    assert ReadRequest(project="p", limit=None).limit == 10  # type: ignore[arg-type]
    for bad in (0, 101, True, "5", 2.0):
        with pytest.raises(InvalidLimitError):
            ReadRequest(project="p", limit=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, math.inf, math.nan, True, "1", None])
def test_wait_is_finite_seconds(bad: object) -> None:
    with pytest.raises(InvalidWaitError):
        ReadRequest(project="p", wait=bad)  # type: ignore[arg-type]


def test_it_is_frozen_and_knows_a_first_page() -> None:
    request = ReadRequest(project="p", after_cursor="a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.limit = 5  # type: ignore[misc]
    assert request.first_page
    assert not ReadRequest(project="p", through_cursor="t").first_page
    assert not ReadRequest(project="p", page_token="x").first_page


def test_the_wire_names_are_the_fields_and_the_documented_body() -> None:
    fields = {f.name for f in dataclasses.fields(ReadRequest)}
    assert set(FIELD_OF.values()) == fields
    canonical = {name for name in FIELD_OF if name not in ("after", "through")}
    assert set(ReadRequestBody.model_json_schema()["properties"]) == canonical


_TEXT = st.none() | st.text(min_size=1, max_size=12)


@given(
    project=st.text(min_size=1, max_size=12),
    after=_TEXT,
    through=_TEXT,
    token=_TEXT,
    limit=st.integers(1, 100),
    wait=st.sampled_from([0.0, 0.5, 3.0]),
)
def test_what_the_client_sends_the_server_parses_back(
    project: str, after: str | None, through: str | None, token: str | None, limit: int, wait: float
) -> None:
    request = ReadRequest(project, after, through, token, limit, wait)
    parsed = request_from_json(json.dumps(request_body(request)).encode())
    # The long-poll rides only on a first page (a pinned series never waits).
    assert parsed == dataclasses.replace(request, wait=wait if request.first_page else 0.0)
    query = [(k, str(v)) for k, v in request_body(request).items()]
    assert request_from_query(query) == parsed
