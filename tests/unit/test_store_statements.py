"""``statements.parsed``: one parse per text, shared by every cursor; bounded. No broker."""

from __future__ import annotations

import duckdb
import pytest

from throughline.projector.store import statements


def test_a_text_is_parsed_once_and_runs_on_any_connection() -> None:
    sql = "SELECT ? + 1 AS n -- test_a_text_is_parsed_once"
    first = statements.parsed(sql)
    assert isinstance(first, duckdb.Statement) and statements.parsed(sql) is first
    for con in (duckdb.connect(), duckdb.connect()):
        assert con.execute(first, [41]).fetchone() == (42,)


def test_past_its_bound_the_cache_hands_back_the_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(statements, "MAX_PARSED", len(statements._PARSED))
    sql = "SELECT 2 AS n -- test_past_its_bound"
    assert statements.parsed(sql) == sql  # parsed by the execution, as without the cache
    assert duckdb.connect().execute(statements.parsed(sql)).fetchone() == (2,)
    assert sql not in statements._PARSED
