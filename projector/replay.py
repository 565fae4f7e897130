"""Batch replay: rebuild a projection from offset 0 into a new DuckDB file.

Replay is the streaming projector run once, from an empty projection, until every partition reaches
the end offset it had when the replay started (``Projector.run(until_caught_up=True)``). The fold is
deterministic in log order and no table holds a wall-clock value, so the result is row-for-row the
projection a streaming projector builds from the same log, whatever the batch boundaries.

The file is written as ``NEW_FILE.replay-partial`` and renamed to ``NEW_FILE`` only when the replay
completed and was checkpointed, so a failed or interrupted replay never leaves a half-built projection
under the requested name. A ``.replay-partial`` already there (a replay killed before its own cleanup)
is removed, never resumed: it may hold another topic or another log of the same topic name, and a
replay always folds the log from offset 0 into an empty file (docs/design.md, "Replay").
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from throughline.durable import sync_directory
from throughline.log import KafkaClientConfig
from throughline.projector.exceptions import ReplayTargetError
from throughline.projector.runner import Progress, ProgressUpdate, Projector, ProjectorOptions, RunSummary
from throughline.projector.store import DuckProjection, wal_path

log = logging.getLogger(__name__)

PARTIAL_SUFFIX = ".replay-partial"


def _target_problem(path: Path) -> str | None:
    if path.is_dir():
        return f"{path} is a directory"
    if path.exists() and path.stat().st_size > 0:
        return f"{path} already exists and is not empty: replay only writes a new projection file"
    wal = wal_path(path)
    if wal.exists():
        return f"{wal} exists: {path} belongs to a projection; replay only writes a new projection file"
    return None


def replay(
    bootstrap_servers: list[str] | str,
    topic: str,
    db: str | Path,
    *,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
    options: ProjectorOptions | None = None,
    memory_headroom: int | None = None,
    kafka_config: KafkaClientConfig | None = None,
) -> RunSummary:
    """Rebuild the projection of ``topic`` from offset 0 into the new file ``db``.

    ``memory_headroom`` bounds DuckDB's memory beyond its indexes (see ``DuckProjection.open``);
    ``kafka_config``: how to connect (``None``: ``THROUGHLINE_KAFKA_CONFIG``, else PLAINTEXT).
    Raises ``ReplayTargetError`` when ``db`` exists and is not empty. The log errors of the projector
    (``TopicMissingError``, ``BrokerUnavailableError``, ``LogRewoundError``...) propagate; the partial
    file is removed then.
    """
    path = Path(db)
    problem = _target_problem(path)
    if problem is not None:
        raise ReplayTargetError(problem)
    partial = path.with_name(path.name + PARTIAL_SUFFIX)
    _remove_leftover(partial)  # mutant-anchor: replay-leftover-kept
    done = False
    try:
        projection = DuckProjection.open(partial, topic=topic, memory_headroom=memory_headroom)
        try:
            summary = Projector(projection, bootstrap_servers, topic, options=options, kafka_config=kafka_config).run(
                until_caught_up=True, stop=stop, progress=progress
            )
            if not summary.caught_up:
                return summary  # stopped before the end: the partial file is dropped below
            projection.checkpoint()
        finally:
            projection.close()
        problem = _target_problem(path)  # someone may have created it meanwhile
        if problem is not None:
            raise ReplayTargetError(problem)
        os.replace(partial, path)
        sync_directory(path.parent)  # the new name survives a crash, as every durable replace here
        done = True
        return summary
    finally:
        if not done:
            remove_db_files(partial)


def _remove_leftover(partial: Path) -> None:
    """Remove what an earlier replay into the same name left (it was killed before its own cleanup).

    Not resumed even when it is a prefix of this very log: nothing in it proves which log it holds
    beyond the topic id a projector recorded, and a fresh fold costs only the replay's own time.
    """
    found = [p.name for p in (partial, wal_path(partial)) if p.exists()]
    if found:
        log.warning(
            "removing %s, left by an earlier replay that did not finish: a replay always starts from an empty file",
            " and ".join(found),
        )
    remove_db_files(partial)


def remove_db_files(path: Path) -> None:
    """Remove a projection file and its WAL (either may be missing)."""
    for p in (path, wal_path(path)):
        try:
            p.unlink()
        except FileNotFoundError:
            pass


class ProgressBar:
    """A progress bar on a stream (stderr): redrawn in place on a terminal, a line every few seconds otherwise."""

    def __init__(self, stream: TextIO | None = None, *, width: int = 30, line_interval: float = 5.0) -> None:
        self._stream = stream or sys.stderr
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._width = width
        self._interval = 0.1 if self._tty else line_interval
        self._last = 0.0
        self._drawn = False

    def __call__(self, update: ProgressUpdate) -> None:
        now = time.monotonic()
        if now - self._last < self._interval:
            return
        self._last = now
        self._draw(update)

    def _draw(self, update: ProgressUpdate) -> None:
        targets = update.targets or {}
        total = sum(max(0, end - update.started_at.get(p, 0)) for p, end in targets.items())
        done = sum(
            max(0, min(update.applied.get(p, 0), end) - update.started_at.get(p, 0)) for p, end in targets.items()
        )
        fraction = done / total if total else 1.0
        filled = int(round(fraction * self._width))
        rate = update.summary.records / update.elapsed if update.elapsed > 0 else 0.0
        text = (
            f"[{'#' * filled}{'.' * (self._width - filled)}] {fraction * 100:5.1f}% "
            f"{done}/{total} offsets, {update.summary.appended} turns, {update.summary.quarantined} quarantined, "
            f"{rate:,.0f} records/s"
        )
        if self._tty:
            self._stream.write("\r" + text)
            self._drawn = True
        else:
            self._stream.write(text + "\n")
        self._stream.flush()

    def finish(self, update: ProgressUpdate | None = None) -> None:
        """Draw the final state (when known) and end the line."""
        if update is not None:
            self._draw(update)
        if self._tty and self._drawn:
            self._stream.write("\n")
            self._stream.flush()
