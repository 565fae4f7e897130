"""Where the projection last placed a turn id: the fold's look-up for a turn id applied before.

The fold (``throughline.core.fold.fold_turn``) decides a record whose turn id its source applied
before by where that id was last placed: its seq and content then (``Placement``; whether it is still
live is read from the chain at that seq by the caller). A turn id is placed by the record that appended
or amended it and stays at that seq until a later record of its id places it again; a rewind or an
amend that supersedes it moves its row into ``superseded_turns`` and leaves the placement as it was.
So the last placement is the id's live row in ``turns`` (a source holds a turn id live at most once),
else its row in ``superseded_turns`` superseded last. Which of the two it is, is the turn's liveness
in the file: the fold reads it for a turn below what the batch changed (whose rows the batch left as
they are), so a re-sent turn costs no look-up of its own.

Why no column for it (the projection's schema is unchanged): the look-up is needed only for a turn
key ``turn_ids`` already holds (a re-sent turn; a new id, by far the most common record, never pays
for it), and it is found in three steps, each only for the keys the one before did not find:

1. the live row in the page bucket of the record's own seq (``view.page_key``: one index lookup for
   all the keys; an exact re-send, and most re-ingested turns, are found here);
2. the live row anywhere in the source's chain (a scan of ``turns`` joined on (source, turn id): a
   turn the newer parser numbers in another bucket, or a record without a seq);
3. the row of ``superseded_turns`` superseded last (a scan of that table: a stale re-send across a
   host rewind, a turn a newer parser moved).
"""

from __future__ import annotations

from collections.abc import Mapping

import duckdb
import pyarrow as pa

from throughline.projector.store.view import page_key
from throughline.projector.store.writes import execute_over

#: A turn key's (source, turn id, seq of the record that asks, or None).
Wanted = tuple[bytes, str, int | None]

#: Bucket keys looked up by one statement (the IN list stays short enough for the index scan).
_BUCKETS = 256


#: Where a turn key was last placed: (seq, content digest, whether the turn is live there).
Placed = tuple[int, bytes, bool]


def stored_placements(cur: duckdb.DuckDBPyConnection, wanted: Mapping[bytes, Wanted]) -> dict[bytes, Placed]:
    """(seq, content digest, live) of the last placement of each of ``wanted``'s turn keys that the
    projection holds (keys of turns it never placed are absent)."""
    found: dict[bytes, Placed] = {}
    if not wanted:
        return found
    by_id = {(source, turn_id): key for key, (source, turn_id, _) in wanted.items()}
    buckets = sorted({page_key(source, seq) for source, _, seq in wanted.values() if seq is not None})
    for first in range(0, len(buckets), _BUCKETS):
        chunk = buckets[first : first + _BUCKETS]
        sql = (
            "SELECT source_sha256, turn_id, seq, content_digest FROM turns "  # noqa: S608 (bound parameters only)
            f"WHERE page_key IN ({', '.join('?' for _ in range(len(chunk)))})"
        )
        for source, turn_id, seq, content in cur.execute(sql, chunk).fetchall():
            key = by_id.get((bytes(source), turn_id))
            if key is not None:
                found[key] = (int(seq), bytes(content), True)
    rest = [(source, turn_id) for key, (source, turn_id, _) in wanted.items() if key not in found]
    if rest:
        table = pa.table(
            {
                "source_sha256": pa.array([s for s, _ in rest], pa.binary()),
                "turn_id": pa.array([t for _, t in rest], pa.string()),
            }
        )
        live = execute_over(
            cur,
            "SELECT t.source_sha256, t.turn_id, t.seq, t.content_digest FROM turns t "
            "JOIN tl_rows w ON t.source_sha256 = w.source_sha256 AND t.turn_id = w.turn_id",
            table,
        ).fetchall()
        for source, turn_id, seq, content in live:
            found[by_id[(bytes(source), turn_id)]] = (int(seq), bytes(content), True)
        if len(found) < len(wanted):
            gone = execute_over(
                cur,
                "SELECT s.source_sha256, s.turn_id, arg_max(s.seq, (s.superseded_partition, s.superseded_offset)), "
                "arg_max(s.content_digest, (s.superseded_partition, s.superseded_offset)) FROM superseded_turns s "
                "JOIN tl_rows w ON s.source_sha256 = w.source_sha256 AND s.turn_id = w.turn_id "
                "GROUP BY s.source_sha256, s.turn_id",
                table,
            ).fetchall()
            for source, turn_id, seq, content in gone:
                key = by_id[(bytes(source), turn_id)]
                if key not in found:
                    found[key] = (int(seq), bytes(content), False)
    return found
