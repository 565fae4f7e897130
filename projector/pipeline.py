"""Readable before committed: each poll is folded for readers at once, and committed on a writer thread.

Inside ``serve`` the readers share the projection with the projector. Committing a poll costs a DuckDB
transaction of five statements (16-25 ms of wall time on two busy cores at any steady rate, the
projector in one 80-90% of the time), and a turn used to wait for the transaction in flight and then
for its own before a read could serve it. ``StagedWriter`` takes both waits off a read's path:

1. The projector's thread takes a poll from the feed and *stages* it (``DuckProjection.stage``): the
   same fold as the transaction's, over the committed projection plus what is staged above it, kept in
   memory as a layer that every read sees at once (``throughline.core.layers``). Staging a poll of a
   few records costs 1-2 ms of CPU (measured inside ``serve`` at 100 turns/s).
2. The poll is queued for the writer thread, which commits every queued poll in one transaction
   (``Tally.apply``: ``DuckProjection.apply_prepared``, the exactly-once path, unchanged) at most every
   ``commit_interval`` seconds (sooner when half the queue's bound is reached or a drain waits); the
   commit drops the layers it covers in the same step as it publishes its version. Readers no longer
   wait for commits, so commits need not follow every poll: at 100 turns/s the projector went from
   ~34 transactions a second, in one 80-85% of the time, to 10 a second, in one ~27% of the time, and
   those cores went to the reads (a turn readable 44-46 ms after its append at the median instead of
   64-80 on the same VM; docs/benchmarks.md).

What stays as it was: the file is written only by ``apply_prepared``, so a crash at any instant loses
and duplicates nothing, and what a reader was served from a layer is what the commit writes
(docs/design.md, "Readable before committed"). When a commit fails, the layers are dropped
(``unstage``) and the error ends the run as before. A poll holding a repair record is committed alone
after the queue has drained (a repair writes while it is folded).

Backpressure: while the queue holds more than ``max_queued_records`` records the projector's thread
waits for the writer, so memory stays bounded and the writer's transactions grow with the backlog.
``serve`` bounds it at ``QUEUED_POLLS`` polls: a checkpoint stops the writer for a few hundred
milliseconds (0.3-0.5 s at 33k turns/s), and staging, which no longer waits for it
(``store.stored_keys``), should not wait for the queue instead. Measured at 33k turns/s with 64
projects, two runs each: ack -> readable p99 434 and 405 ms with 4 polls, 574 and 514 with 2.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Union

from throughline.projector.prepare import PreparedBatch, merge_polls, split_poll
from throughline.projector.store import DuckProjection, stageable
from throughline.projector.tally import Tally

Writer = Union["DirectWriter", "StagedWriter"]

#: The longest a drain waits for the writer to commit what is queued, in seconds (a commit takes ms).
DRAIN_TIMEOUT = 600.0
_WAKE_S = 0.1  # waits wake at least this often to look for the writer's error
#: ``serve``'s bound on what waits for the writer, in polls of ``max_poll_records`` (see above).
QUEUED_POLLS = 4
#: Records a transaction commits at most while nobody reads the projection yet (``staging`` clear). Each
#: transaction has a fixed cost (tens of milliseconds on two busy cores): with 64, a rebuild's catch-up of
#: ~1,500 records in ``serve`` took 1.2-1.5 s and slowed the reads all along; with polls packed up to
#: 1,000, 0.6-0.7 s (docs/benchmarks.md, "9. Reads during a rebuild's switch").
UNREAD_SLICE = 1_000


class StageGate:
    """Whether a run may still make more of the log readable: stage a poll, or commit one it could not stage.

    ``close`` returns once no poll is being made readable and none will be, so from then on the offsets
    the run's readers see are final (``serve``'s switch of files takes them as what the new file must
    reach, without waiting for the run's loop to notice its stop, which it does only when its poll
    returns). A writer whose gate is closed drops the polls it is handed: the caller stops the run before
    closing it, and the next run fetches them again from the applied offsets.

    Threading: ``close`` from any thread; ``admitting`` from the run's thread only. One lock, held for a
    staging (1-2 ms) or, rarely, a poll committed unstaged (a repair: a transaction).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed = False

    def close(self, timeout: float) -> bool:
        """Admit nothing more; ``True`` once the poll being admitted (if any) is readable, within ``timeout``."""
        if not self._lock.acquire(timeout=max(0.0, timeout)):
            return False
        try:
            self._closed = True
        finally:
            self._lock.release()
        return True

    @contextmanager
    def admitting(self) -> Iterator[bool]:
        """Whether the poll in hand may be made readable; a ``close`` waits until the block ends."""
        with self._lock:
            yield not self._closed


class DirectWriter:
    """Commits each poll on the calling thread as it comes (``project``, ``replay``: no reader in process)."""

    def __init__(self, topic: str, tally: Tally, gate: StageGate | None = None) -> None:
        self._topic = topic
        self._tally = tally
        self._gate = gate or StageGate()

    def apply(self, batches: Sequence[PreparedBatch]) -> None:
        """Commit one poll (``Tally.apply``), unless the gate closed."""
        with self._gate.admitting() as admitted:
            if admitted:
                self._tally.apply(self._topic, batches)

    def drain(self) -> None:
        """Nothing is ever queued."""

    def raise_pending(self) -> None:
        """Nothing fails behind the caller's back."""

    def close(self) -> None:
        """Nothing to stop."""


class StagedWriter:
    """Stages polls for readers on the calling thread and commits them on a writer thread of its own."""

    def __init__(
        self,
        projection: DuckProjection,
        topic: str,
        tally: Tally,
        *,
        max_queued_records: int,
        commit_interval: float = 0.0,
        prompt: threading.Event | None = None,
        gate: StageGate | None = None,
        staging: threading.Event | None = None,
    ) -> None:
        self._projection = projection
        self._topic = topic
        self._tally = tally
        self._max_queued = max(1, max_queued_records)
        self._interval = max(0.0, commit_interval)
        # Set while someone waits for the commits (``serve``'s switch of files): each poll is committed as
        # soon as it is queued (the writer wakes at each one), not after ``commit_interval``.
        self._prompt = prompt
        self._gate = gate or StageGate()
        # Cleared while nobody reads the projection yet (``serve``'s rebuild: the new file's run before
        # its switch): each poll is then committed as it comes, folded once instead of twice.
        self._staging = staging
        self._cond = threading.Condition()
        self._queue: list[Sequence[PreparedBatch]] = []
        self._queued = 0  # records queued or being committed
        self._busy = False
        self._draining = False
        self._closed = False
        self._error: BaseException | None = None
        # Its stored turn keys fill now, while the run starts (or, not serving yet, catches up): not beside
        # the first polls readers wait for.
        projection.prepare_staging()
        self._thread = threading.Thread(target=self._run, name="throughline-writer", daemon=True)
        self._thread.start()

    def apply(self, batches: Sequence[PreparedBatch]) -> None:
        """Stage one poll (readers see it now) and queue it for the writer; raise the writer's error. A poll
        holding a repair, or any while ``staging`` is clear, is committed here instead, after the queue. A
        poll handed over once the gate closed is dropped (the run is stopping)."""
        self.raise_pending()
        unread = self._staging is not None and not self._staging.is_set()
        if unread or not stageable(batches):
            self.drain()
            # A repair is committed whole; nobody reads it yet (a rebuild's new file catching up in serve's
            # process): in bounded transactions, so that none of a large poll holds the reads' cores for long.
            parts = split_poll(batches, UNREAD_SLICE) if stageable(batches) else [batches]
            for part in parts:
                with self._gate.admitting() as admitted:
                    if not admitted:
                        return
                    self._tally.apply(self._topic, part)
            return
        with self._gate.admitting() as admitted:
            if not admitted:
                return
            self._projection.stage(self._topic, batches)
        records = sum(len(b.items) for b in batches)
        with self._cond:
            self._queue.append(batches)
            self._queued += records
            self._cond.notify_all()
            while self._queued > self._max_queued and self._error is None and not self._closed:
                self._cond.wait(_WAKE_S)
        self.raise_pending()

    def drain(self, timeout: float = DRAIN_TIMEOUT) -> None:
        """Wait until every queued poll is committed (or the writer failed: raise its error)."""
        with self._cond:
            self._draining = True
            self._cond.notify_all()
            try:
                self._cond.wait_for(lambda: self._error is not None or not (self._queue or self._busy), timeout)
            finally:
                self._draining = False
        self.raise_pending()

    def raise_pending(self) -> None:
        """Raise the error that stopped the writer, if any."""
        with self._cond:
            error = self._error
        if error is not None:
            raise error

    def close(self) -> None:
        """Stop the writer after the commit in flight; what is still queued is dropped with its layers
        (the feed fetches it again from the applied offsets)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        self._projection.unstage()

    def _hurried(self) -> bool:
        """A drain, or the ``prompt``, waits for the commits."""
        return self._draining or (self._prompt is not None and self._prompt.is_set())

    def _run(self) -> None:
        last = 0.0
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                # Readers have the queued polls already: commit at most every ``commit_interval``,
                # sooner when the queue fills or a drain waits.
                due = last + self._interval
                while not self._closed and self._queued <= self._max_queued // 2 and not self._hurried():
                    left = due - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if self._closed:
                    return
                last = time.monotonic()
                polls, self._queue = self._queue, []
                self._busy = True
            try:
                self._tally.apply(self._topic, merge_polls(polls))
            except BaseException as exc:  # the run raises it (``raise_pending``); readers lose the layers
                self._projection.unstage()
                with self._cond:
                    self._error = exc
                    self._busy = False
                    self._cond.notify_all()
                return
            with self._cond:
                self._busy = False
                self._queued -= sum(len(b.items) for poll in polls for b in poll)
                self._cond.notify_all()
