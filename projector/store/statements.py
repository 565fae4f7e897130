"""Statements parsed once per text: DuckDB then only binds, plans and runs them.

``parsed(sql)`` is what the hot statements go through: the reader's turns statement (a few dozen
shapes) and the writer's statements of a small transaction (BEGIN, the turn-id and turn INSERTs of a
few rows, the tracking-row and head UPDATEs, COMMIT). A parsed ``duckdb.Statement`` is copied by each
execution, so one serves every cursor and thread. Measured inside a transaction of three such
statements (threads=1, alternated, 350 each): 2.6-3.2 ms of CPU parsed against 3.2-3.8 ms as text.
"""

from __future__ import annotations

import threading

import duckdb

#: Texts kept parsed, at most (the shapes in use are far fewer: statements x row counts that
#: ``writes.fits_values`` lets through); a text past it is parsed by each execution, as before.
MAX_PARSED = 4096

_PARSED: dict[str, duckdb.Statement] = {}
_PARSER: list[duckdb.DuckDBPyConnection] = []  # opened at the first parse, not at import
_LOCK = threading.Lock()


def parsed(sql: str) -> duckdb.Statement | str:
    """``sql`` parsed (one statement), from the cache when it was parsed before; the text itself when
    the cache is full."""
    statement = _PARSED.get(sql)
    if statement is not None:
        return statement
    # Parsing needs a connection, not a database: a private one, so no reader's or writer's cursor is
    # used from two threads; a parsed statement then runs on any connection.
    with _LOCK:
        statement = _PARSED.get(sql)
        if statement is not None:
            return statement
        if len(_PARSED) >= MAX_PARSED:
            return sql
        if not _PARSER:
            _PARSER.append(duckdb.connect(":memory:"))
        statement = _PARSED[sql] = _PARSER[0].extract_statements(sql)[0]
    return statement
