"""A run's running totals: each applied batch counted, timed and reported to the progress callback."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from throughline.projector.prepare import PreparedBatch
from throughline.projector.store import BatchSummary, DuckProjection


@dataclass(frozen=True, slots=True)
class ProgressUpdate:
    """Where a run is, handed to the ``progress`` callback after each applied batch."""

    summary: BatchSummary
    applied: Mapping[int, int]
    targets: Mapping[int, int] | None
    started_at: Mapping[int, int]
    elapsed: float
    #: The batch just applied (one transaction) and how long applying it took (seconds, wall time:
    #: the fold and the statements, from the batch in hand to its commit).
    batch: BatchSummary = BatchSummary()
    batch_seconds: float = 0.0


Progress = Callable[[ProgressUpdate], None]


class Tally:
    """Running totals of a run, reported to the progress callback after each applied batch."""

    def __init__(
        self,
        projection: DuckProjection,
        progress: Progress | None,
        targets: Mapping[int, int] | None,
        start_offsets: Mapping[int, int],
        started: float,
    ) -> None:
        self._projection = projection
        self._progress = progress
        self._targets = targets
        self._start_offsets = dict(start_offsets)
        self._started = started
        self._lock = threading.Lock()
        self.total = BatchSummary()

    def apply(self, topic: str, batches: Sequence[PreparedBatch]) -> None:
        """Apply ``batches`` in one transaction (``DuckProjection.apply_prepared``), timed, and report it."""
        began = time.perf_counter()
        summary = self._projection.apply_prepared(topic, batches)
        self.add(summary, time.perf_counter() - began)

    def add(self, summary: BatchSummary, seconds: float) -> None:
        """Count one applied batch (``seconds``: how long applying it took) and report the run's totals."""
        with self._lock:
            self.total = self.total + summary
            current = self.total
        if self._progress is not None:
            self._progress(
                ProgressUpdate(
                    current,
                    self._projection.applied_offsets(),
                    self._targets,
                    self._start_offsets,
                    time.monotonic() - self._started,
                    summary,
                    seconds,
                )
            )
