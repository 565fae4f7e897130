"""Read snapshots of a projection file: ``snapshot_view`` (in a transaction) and ``quiet_view`` (without one
while no commit is under way), each with the layers staged above its version (``throughline.core.layers``).

What a view's answers are made of: applied offsets, project heads and chain heads from memory (the
``ReadSnapshot`` a view takes once from the projection's ``ReadState``, and its ``ReadIndex``) when the
snapshot's version is the index's, turns always from DuckDB, and on top of both the layers the
projector has folded but not committed yet (``DuckProjection.stage``). A read-only file cannot change,
so needs no transaction and has no layers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import duckdb

from throughline.core.layers import Layer, LayeredView
from throughline.projector.read_state import ReadState
from throughline.projector.store.files import CursorPool
from throughline.projector.store.statements import parsed
from throughline.projector.store.view import DuckView, snapshot_version


@contextmanager
def snapshot_view(
    cursors: CursorPool, topic: str | None, reads: ReadState, *, read_only: bool
) -> Iterator[DuckView | LayeredView]:
    """One consistent snapshot: every answer of the yielded view is of one version (and the layers above it)."""
    with cursors.borrowed() as cur:
        if read_only:
            snap = reads.snapshot
            yield DuckView(cur, topic, reads.index, snap.version, snap.applied)
            return
        cur.execute(parsed("BEGIN TRANSACTION"))
        try:
            view, layers = _snapshot(cur, topic, reads)
            yield LayeredView(view, layers) if layers else view
        finally:
            cur.execute(parsed("ROLLBACK"))  # read-only transaction: nothing to keep


@contextmanager
def quiet_view(
    cursors: CursorPool, topic: str | None, reads: ReadState, *, read_only: bool
) -> Iterator[DuckView | LayeredView]:
    """``snapshot_view``, without a transaction while no commit is under way: its statements are each their
    own snapshot, checked to have read the snapshot's version, and it raises ``Overtaken`` when a
    commit lands meanwhile. What the reader asks for: on an idle projection a page is one statement,
    not BEGIN, the version, the turns and ROLLBACK."""
    snap = reads.snapshot  # taken once: the read answers from this value
    if read_only or not snap.quiet:
        with snapshot_view(cursors, topic, reads, read_only=read_only) as view:
            yield view
        return
    generation = snap.generation
    with cursors.borrowed() as cur:
        view = DuckView(
            cur,
            topic,
            reads.index,
            snap.version,
            snap.applied,
            check=lambda: reads.snapshot.generation == generation,
        )
        yield LayeredView(view, snap.layers) if snap.layers else view


def _snapshot(
    cur: duckdb.DuckDBPyConnection, topic: str | None, reads: ReadState
) -> tuple[DuckView, tuple[Layer, ...]]:
    """A view of the transaction open on ``cur``: with the index when their versions agree, and with the
    layers staged above the index's version.

    DuckDB takes the snapshot when the transaction first reads, not at BEGIN; that read runs under the
    read state's condition, so no layer is staged or dropped and no commit published while it runs.
    The file may still be a commit ahead of the index (committed, not yet published): every commit it
    holds beyond the index's version is of layers captured here (a layer is dropped only when its
    commit is published), and layers compose over a file that already holds some of them to the same
    state (``throughline.core.layers``). So the view is the captured layers over the snapshot, read
    without the index (whose entries are of the older version) when the versions differ.
    """
    with reads.cond:
        snap = reads.snapshot
        file_version = snapshot_version(cur, topic)
    if file_version == snap.version:
        return DuckView(cur, topic, reads.index, snap.version, snap.applied), snap.layers
    return DuckView(cur, topic), snap.layers
