"""The files of a rebuild without downtime (``serve --rebuild``), and what a start does with them.

A rebuild writes the new projection beside the live one, at ``DB.rebuild`` (with DuckDB's
``DB.rebuild.wal``). The one durable fact that says which file is the projection is the marker
``DB.rebuild.switched``, created (and its directory synced) only after the new file caught up with the
live one and was checkpointed, just before reads switch to it:

- no marker: ``DB`` is the projection; a ``DB.rebuild`` is an unfinished rebuild and is removed;
- the marker: ``DB.rebuild`` is the projection (``DB``, if still there, is the old one and is removed).

DuckDB names its WAL after the database path and opens, truncates and removes it by that name, so a
database file is never renamed while a handle holds it (after the rename the WAL of the running handle
would sit beside a file of another name, and a crash would leave it behind). The rebuilt file therefore
keeps its name while ``serve`` runs, and is moved to ``DB`` when no handle holds it: by ``finish``, when
``serve`` stops, and by ``recover`` when it starts (after a crash). Each step of both is safe to repeat
after a crash at any instant: the marker is removed last.

The replay also leaves ``DB.rebuild.keys`` when it stops (``turn_keys_of``: the turn keys it kept, for
``serve`` to adopt rather than scan, ``projector.store.stored_keys``); ``serve`` removes it once it
opened the file, and a start removes it with an unfinished rebuild.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from throughline.durable import sync_directory
from throughline.projector.exceptions import ProjectionBusyError
from throughline.projector.replay import remove_db_files
from throughline.projector.store import wal_path

log = logging.getLogger(__name__)

REBUILD_SUFFIX = ".rebuild"
SWITCHED_SUFFIX = ".rebuild.switched"
KEYS_SUFFIX = ".keys"


def turn_keys_of(path: Path) -> Path:
    """Where a rebuild's replay hands the turn keys of the file ``path`` over to ``serve``."""
    return path.with_name(path.name + KEYS_SUFFIX)


def remove_turn_keys(path: Path) -> None:
    """Remove the hand-over of ``path``'s turn keys (and a partial one), if any."""
    keys = turn_keys_of(path)
    for leftover in (keys, keys.with_name(keys.name + ".tmp")):
        leftover.unlink(missing_ok=True)


@dataclass(frozen=True, slots=True)
class RebuildFiles:
    """The names a rebuild of the projection ``db`` uses."""

    db: Path

    @property
    def rebuilt(self) -> Path:
        """Where the new projection is written (and served from after the switch, until the next stop)."""
        return self.db.with_name(self.db.name + REBUILD_SUFFIX)

    @property
    def marker(self) -> Path:
        """Exists exactly when ``rebuilt`` is the projection."""
        return self.db.with_name(self.db.name + SWITCHED_SUFFIX)

    def switched(self) -> bool:
        """Whether reads switched to ``rebuilt`` (the marker exists)."""
        return self.marker.exists()

    def remove_unfinished(self) -> None:
        """Remove a rebuild that never switched (its file and WAL); the caller checked ``switched()``."""
        found = [p.name for p in (self.rebuilt, wal_path(self.rebuilt)) if p.exists()]
        if found:
            log.warning("removing %s, left by a rebuild that did not switch", " and ".join(found))
        remove_db_files(self.rebuilt)
        remove_turn_keys(self.rebuilt)

    def mark_switched(self) -> None:
        """Make ``rebuilt`` the projection, durably (its content must be checkpointed first)."""
        fd = os.open(self.marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        sync_directory(self.db.parent)

    def remove_old(self) -> None:
        """Remove the old projection ``db`` (and its WAL) once no handle holds it; only after the switch."""
        remove_db_files(self.db)
        sync_directory(self.db.parent)

    def finish(self, settle: Callable[[Path], None]) -> None:
        """Move a switched rebuild to ``db``: ``settle(rebuilt)`` opens and checkpoints it (so no WAL
        stays beside it), the old file goes, ``rebuilt`` is renamed over ``db``, the marker goes."""
        if not self.switched():
            return
        if self.rebuilt.exists():
            settle(self.rebuilt)
            leftover = wal_path(self.rebuilt)
            if leftover.exists():  # a checkpointed, closed database keeps none; never carried under db
                log.warning("removing %s after its checkpoint", leftover.name)
                leftover.unlink()
            remove_db_files(self.db)
            os.replace(self.rebuilt, self.db)
            sync_directory(self.db.parent)
            log.warning("the rebuilt projection is now %s", self.db)
        remove_turn_keys(self.rebuilt)
        self.marker.unlink()
        sync_directory(self.db.parent)

    def recover(self, settle: Callable[[Path], None]) -> None:
        """At start: finish a switched rebuild, or remove an unfinished one. Either way ``settle`` opens
        the rebuilt file first: a process that holds it (a running ``serve`` of the same files) makes that
        fail on DuckDB's lock (``ProjectionBusyError``) before anything is removed or renamed."""
        if self.switched():
            self.finish(settle)
            return
        if self.rebuilt.exists():
            try:
                settle(self.rebuilt)
            except ProjectionBusyError:
                raise
            except Exception as exc:  # an unfinished file that does not even open is removed all the same
                log.warning("%s does not open (%s); removing it", self.rebuilt.name, exc)
        self.remove_unfinished()
