"""``StoredTurnKeys``: which turn keys ``turn_ids`` may hold, kept in memory for the staged fold.

Why. Staging a poll asks, for each of its new (source, turn id) keys, whether ``turn_ids`` holds it
(the fold's duplicate check). Asked of DuckDB, that was a hash join scanning the whole table for every
poll of more than a few keys (11 ms at 1M keys, 31 ms at 5M, growing with the history), and, worse,
DuckDB makes every read wait while a checkpoint runs: measured inside ``serve`` at 33k turns/s, the
projector's thread stopped staging for each whole checkpoint (318-494 ms), so readers fell behind by
that much and then by the backlog it left. With a ``KeyFilter`` over every stored key, a new key (the
usual case) is known new without DuckDB; only a key the filter reports maybe present (every key applied
before, and about 6 in a million of the others) is looked up.

How it stays exact. The filter is created, then filled from a scan of ``turn_ids`` on a thread of its
own, and every commit adds the keys it appended (``committed``) from the moment the filter exists, so
a key committed before the scan began is in the scan and one committed after it is added by its
commit (keys added twice do no harm). The commit adds its keys before it drops the layers that held
them. Keys are never removed: a key the table lost (a rejected record's probe) stays a maybe, which
costs a lookup, never a wrong answer. Until the scan is done (``ready``) every key is looked up as
before.

Handed over. A file created empty needs no scan: its filter is exact from the start (``start_empty``)
if every commit adds its keys. A rebuild's replay keeps one so, and writes it beside the file when it
stops (``save``: the filter's bytes after a header naming the rows of ``turn_ids`` and the applied
offsets it is exact at); ``serve``, which opens the file next, adopts it (``adopt``) when both still
match the file, instead of scanning ``turn_ids`` in its own process while it serves reads (2.3 s of
Python a million keys). Anything else (no hand-over, another file's, a damaged one) is a scan, as before.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import duckdb

from throughline.core.key_filter import KeyFilter
from throughline.projector.store.files import cursor

log = logging.getLogger(__name__)

#: Keys read from ``turn_ids`` at a time while the filter fills (one Arrow batch, added under the
#: filter's lock in slices of ``_ADD_SLICE`` so that a commit's own keys wait at most ~15 ms).
_SCAN_BATCH = 100_000
_ADD_SLICE = 10_000
#: The first filter's capacity beyond the keys stored at start (it grows by doubling past that).
_MIN_CAPACITY = 1 << 20


#: The first line of a hand-over file (``StoredTurnKeys.save``); the filter's bytes follow it.
HANDOVER_FORMAT = 1


def _stored_rows(con: duckdb.DuckDBPyConnection) -> int:
    cur = cursor(con)
    try:
        rows = cur.execute("SELECT count(*) FROM turn_ids").fetchall()
    finally:
        cur.close()
    return int(rows[0][0]) if rows else 0


class StoredTurnKeys:
    """A ``KeyFilter`` over the turn keys of one projection's ``turn_ids``, filled in the background."""

    def __init__(self) -> None:
        self._filter: KeyFilter | None = None
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def ready(self) -> bool:
        """Whether every stored key is in the filter (``maybe_stored`` answers from then on)."""
        return self._ready.is_set()

    def start(self, con: duckdb.DuckDBPyConnection) -> None:
        """Create the filter and start filling it from ``turn_ids`` (once; later calls do nothing).

        Call it before the first poll is staged, from the thread that stages; commits may run meanwhile.
        """
        if self._filter is not None:
            return
        stored = _stored_rows(con)
        # Room for a quarter more before a second filter (each filter's bits are a power of two, so
        # this is 4-8 bytes a stored key).
        self._filter = KeyFilter(max(_MIN_CAPACITY, stored + stored // 4))
        self._thread = threading.Thread(
            target=self._fill, args=(cursor(con),), name="throughline-turn-keys", daemon=True
        )
        self._thread.start()

    def start_empty(self, con: duckdb.DuckDBPyConnection) -> bool:
        """Start a filter that is exact from here on, without a scan, when ``turn_ids`` is empty (a new file);
        ``False`` (nothing started) otherwise. Call it before the first commit or ``start``."""
        if self._filter is not None or _stored_rows(con) != 0:
            return False
        self._filter = KeyFilter(_MIN_CAPACITY)
        self._ready.set()
        return True

    def save(self, con: duckdb.DuckDBPyConnection, path: Path, applied: Mapping[int, int]) -> bool:
        """Write the filter for the next process to open the file (``adopt``), exact at ``applied`` (the
        file's applied offsets, after its last commit); ``False`` when it is not ready (nothing written).
        Written whole or not at all (a temporary file renamed), not synced: a lost one is a scan."""
        if not self._ready.is_set():
            return False
        assert self._filter is not None
        header = {
            "format": HANDOVER_FORMAT,
            "rows": _stored_rows(con),
            "applied": {str(p): int(o) for p, o in sorted(applied.items())},
        }
        temporary = path.with_name(path.name + ".tmp")
        with open(temporary, "wb") as out:
            out.write(json.dumps(header).encode() + b"\n")
            out.write(self._filter.to_bytes())
        os.replace(temporary, path)
        return True

    def adopt(self, con: duckdb.DuckDBPyConnection, path: Path, applied: Mapping[int, int]) -> bool:
        """Take the filter ``save`` wrote at ``path`` as this file's, ready at once, when it is exact for the
        file as it is (its rows of ``turn_ids`` and its applied offsets ``applied``); ``False`` otherwise
        (no file, another file's, a damaged one: the log says why), and ``start`` scans as before. Call it
        before ``start`` and the first commit."""
        if self._filter is not None:
            return False
        try:
            with open(path, "rb") as f:
                header = json.loads(f.readline())
                handed = KeyFilter.from_bytes(f.read())
            if not isinstance(header, dict) or header.get("format") != HANDOVER_FORMAT:
                raise ValueError("not a hand-over of format 1")
            rows = int(header["rows"])
            offsets = {int(p): int(o) for p, o in dict(header["applied"]).items()}
        except FileNotFoundError:
            return False
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("the turn keys handed over in %s are not used (%s): scanning turn_ids", path, exc)
            return False
        stored = _stored_rows(con)
        now = {int(p): int(o) for p, o in applied.items()}
        if rows != stored or offsets != now or handed.count < rows:
            log.warning(
                "the turn keys handed over in %s are of another state of the file (%d rows at %s; it holds %d "
                "at %s): scanning turn_ids",
                path,
                rows,
                offsets,
                stored,
                now,
            )
            return False
        self._filter = handed
        self._ready.set()
        return True

    def _fill(self, cur: duckdb.DuckDBPyConnection) -> None:
        assert self._filter is not None
        try:
            rows = cur.sql("SELECT turn_key FROM turn_ids")
            # DuckDB 2.x names it to_arrow_reader, 1.x record_batch.
            batches = getattr(rows, "to_arrow_reader", None) or getattr(rows, "record_batch")  # noqa: B009
            for batch in batches(_SCAN_BATCH):
                keys = batch.column(0).to_pylist()  # a BLOB column: Arrow binary, bytes in Python
                for first in range(0, len(keys), _ADD_SLICE):
                    if self._stop.is_set():
                        return
                    self._filter.add_many(keys[first : first + _ADD_SLICE])
            self._ready.set()
            log.debug("turn keys in memory: %r", self._filter)
        except Exception as exc:  # the filter only saves lookups, which stay exact without it
            # The projection closed under the scan, or a key of another shape: stay not ready (every
            # key is then looked up in the table, as without the filter).
            if not self._stop.is_set():
                log.warning("turn keys are looked up in the projection: %s: %s", type(exc).__name__, exc)
        finally:
            cur.close()

    def committed(self, keys: Iterable[bytes]) -> None:
        """Add the keys a commit appended under (call before the layers holding them are dropped)."""
        if self._filter is not None:
            self._filter.add_many(keys)

    def maybe_stored(self, keys: Sequence[bytes]) -> list[bytes] | None:
        """Those of ``keys`` that ``turn_ids`` may hold (the rest it does not); ``None`` until ``ready``."""
        if not self._ready.is_set():
            return None
        f = self._filter
        assert f is not None
        return [k for k in keys if f.may_contain(k)]

    def close(self, timeout: float = 10.0) -> None:
        """Stop the fill (the filter stays not ready)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
