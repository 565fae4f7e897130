"""``ReadState``: everything reads need in memory, with one owner and one condition.

What it owns: the read index (``ReadIndex``: the applied offsets, the projects' head sources and the
chains' heads at the projection's version, the layers staged above it and the quiet-read generation),
how far the staged layers reach on each partition, the records the projector in this process fetched
but has not applied (``InFlight``), the per-project change counts a long-poll waits on, and whether the
projection is closed. ``cond`` guards all of it (the index locks the same condition), so a commit's
publication, a stage, a fetch and a wait each see one instant; nothing else holds a reference to any
of it.

Snapshots. Each change (a stage, a commit, a drop, a write announced or settled) publishes a new
``ReadSnapshot``: a frozen value of read-only mappings and tuples. A read takes ``snapshot`` once (one
attribute read, no lock) and answers from it: the applied offsets and layers its view starts from,
whether it may read without a transaction (``quiet``) and how far reads answer (``readable``). A
bound a read cannot meet is an answer, not an exception: ``settled`` says whether the projection
proves a partition applied for one project up to an offset, and the waits return it.

Who changes it: the projector's thread, through ``stage``/``commit``/``drop`` (and the writer's
``writing``/``settle`` around its COMMIT); the feed, through ``fetching_from``/``fetched``. Readers only
take snapshots, look entries up in the index and wait on ``cond``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from throughline.core.inflight import InFlight
from throughline.core.layers import Layer
from throughline.projector.read_index import DEFAULT_READ_ENTRIES, ChainHead, ReadIndex


@dataclass(frozen=True, slots=True)
class ReadSnapshot:
    """What a read answers from, as of one change of the read state (never mutated).

    ``version`` and ``applied``: the committed version and applied offsets the index answers at;
    ``layers``: staged above it (oldest first); ``readable``: how far reads answer per partition (the
    applied offsets with every layer folded in); ``generation``: odd while a COMMIT is under way;
    ``quiet``: a read may go without a transaction (no COMMIT under way, no failed write in doubt).
    """

    version: int
    generation: int
    quiet: bool
    applied: Mapping[int, int]
    layers: tuple[Layer, ...]
    readable: Mapping[int, int]


class ReadState:
    """The one owner of the projection's read state (see the module); every method is thread-safe."""

    def __init__(self, applied: Mapping[int, int], *, capacity: int = DEFAULT_READ_ENTRIES) -> None:
        #: The one condition: guards everything here, and is notified at each change readers wait for.
        self.cond = threading.Condition(threading.RLock())
        self.index = ReadIndex(applied, capacity=capacity, lock=self.cond)
        self._inflight = InFlight()
        self._changes: dict[bytes, int] = {}  # project -> commits (or stages) that changed it
        self._staged: dict[int, int] = {}  # partition -> next offset with every staged layer folded in
        self.closed = False
        #: Moves at each ``drop``: a fold over dropped layers is not staged.
        self.epoch = 0
        #: Layers were dropped: nothing is staged until the feed starts again from the committed offsets.
        self.gap = False
        self.snapshot = self._snapshot()

    # ------------------------------------------------------------------ publication (under ``cond``)

    def _snapshot(self) -> ReadSnapshot:
        generation, version, applied, layers, doubt = self.index.state()
        readable = dict(applied)
        for part, offset in self._staged.items():
            readable[part] = max(readable.get(part, 0), offset)
        return ReadSnapshot(
            version,
            generation,
            generation % 2 == 0 and not doubt,
            MappingProxyType(applied),
            layers,
            MappingProxyType(readable),
        )

    def _publish(self) -> None:
        self.snapshot = self._snapshot()
        self.cond.notify_all()

    # ------------------------------------------------------------------ the projector's side

    def stage(self, layer: Layer, epoch: int) -> bool:
        """Add a layer folded over the state of ``epoch``; ``False`` (nothing staged) when layers were
        dropped since (its base is gone)."""
        with self.cond:
            if epoch != self.epoch or self.gap:
                return False
            self.index.stage(layer)
            for part, offset in layer.next_offsets.items():
                self._staged[part] = max(self._staged.get(part, 0), offset)
                self._inflight.applied(part, offset)
            for project in layer.projects:
                self._changes[project] = self._changes.get(project, 0) + 1
            self._publish()
            return True

    def writing(self) -> None:
        """A write is about to COMMIT: no quiet read holds from now until it is published or settled."""
        with self.cond:
            self.index.writing()
            self.snapshot = self._snapshot()

    def settle(self, file_version: int) -> None:
        """A write failed; the file's version read after it says whether quiet reads still hold."""
        with self.cond:
            self.index.settle(file_version)
            self._publish()

    def commit(
        self,
        applied: Mapping[int, int],
        heads: Mapping[bytes, bytes],
        chains: Mapping[bytes, ChainHead],
        projects: Iterable[bytes],
    ) -> tuple[Layer, ...]:
        """A commit: its applied offsets, project heads, chain heads and the projects it changed. The layers
        it covers are dropped in the same step, and returned."""
        with self.cond:
            for part, offset in applied.items():
                self._inflight.applied(part, offset)
            committed = self.index.publish(applied, heads, chains)
            staged = {p for layer in committed for p in layer.projects}  # their readers were woken then
            for project in set(projects) - staged:
                self._changes[project] = self._changes.get(project, 0) + 1
            self._publish()
            return committed

    def drop(self) -> None:
        """Drop every layer (their commit failed): reads see the committed projection only."""
        with self.cond:
            self._drop()
            self._publish()

    def _drop(self) -> None:
        self.epoch += 1
        self._staged.clear()
        if self.index.unstage():
            # Their records are unapplied again and held nowhere: nothing past the committed offsets is
            # proven, and a poll staged now would leave them out, until the feed starts again from the
            # committed offsets (``fetching_from``).
            self._inflight.start(self.snapshot.applied)
            self.gap = True

    def fetching_from(self, offsets: Mapping[int, int]) -> None:
        """The projector's feed (re)starts at ``offsets`` (the applied offsets): nothing is in flight."""
        with self.cond:
            self._inflight.start(offsets)
            self.gap = False  # what dropped layers held is fetched again

    def fetched(self, batches: Iterable[tuple[int, list[tuple[int, bytes | None]], int]]) -> None:
        """(partition, records as (offset, project), next offset) the feed delivered, about to be applied
        (each partition contiguous since ``fetching_from``)."""
        with self.cond:
            for partition, records, next_offset in batches:
                self._inflight.add(partition, records, next_offset)
            self.cond.notify_all()

    def close(self) -> None:
        """The projection closed: every waiter returns at once."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    # ------------------------------------------------------------------ the readers' side

    def settled(self, partition: int, project_sha256: bytes, offset: int) -> bool:
        """Whether no record of the project on ``partition`` below ``offset`` is unapplied, as far as this
        process can prove it (``throughline.core.inflight``; staged records count as applied)."""
        with self.cond:
            readable = self.snapshot.readable.get(partition, 0)
            return self._inflight.settled(partition, project_sha256, offset, readable)

    def project_changes(self, project_sha256: bytes) -> int:
        """How many commits (or stages) of this process changed the project's chains so far."""
        with self.cond:
            return self._changes.get(project_sha256, 0)

    def wait_until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Wait at most ``timeout`` seconds, woken at each change, until ``done()`` (asked under ``cond``);
        a closed state ends the wait at once."""
        with self.cond:
            self.cond.wait_for(lambda: done() or self.closed, max(0.0, timeout))
            return done()
