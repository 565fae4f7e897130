"""A group member bootstraps a partition it gains from a peer's projection snapshot
(docs/scale-out.md "A member joins: bootstrap from a peer").

When the group gives a member a partition its file holds nothing of (applied offset 0) while the log
holds records of it, or one its file is ``FAR_BEHIND`` records or more behind on, the member asks the
other members the owner map names (this generation's holders of the partition first, then every other
member: a partition that moved here is named by nobody else any more, and the member that held it
before still has its rows) for their snapshot of just that partition (``CutFetcher``, supplied by
``serve``: the admin endpoint, the same token and TLS context as ``serve --bootstrap-from``), checks it
(manifest, digests, then against the log: topic, topic id, partition count, no offset past the log's
end), loads it into its own file in one transaction (``DuckProjection.load_cut_partitions``; a
far-behind partition's rows are replaced in that same transaction) and fetches the partition from the
snapshot's offset. A member whose snapshot is not ahead of the file is skipped; any refusal or failed
fetch is logged with its code and the next member is tried; when none gives a snapshot the member
catches up from the log from its file's offset (0 for an empty one), as without this.

``MemberBoots`` keeps the consumer's poll loop free while it happens: the group protocol (heartbeats
aside) advances only inside ``poll``, and a member that does not poll for ``max_poll_interval_ms`` leaves
the group. So the consumer pauses the partition (kafka-python's ``pause``: the member keeps polling,
rebalancing and applying its other partitions), the download and the checks of the files run on a
worker thread of their own (it gets immutable values and hands back a ``Downloaded`` through a
``Future``; at most ``PARALLEL_DOWNLOADS`` at once), and once one is done the projector's thread starts
its load on a worker thread too (one load at a time: that worker is the file's writer until it ends, so
every held partition is paused and nothing else is applied meanwhile, while the projector's thread goes
on polling), then seeks the partition to the snapshot's offset, every other held partition back to the
file's offset (what was polled during the load was dropped), and resumes them. Nothing of a booting
partition is applied meanwhile: its polled records are dropped and it is left out of the poll's batches
(a paused partition whose position moved must not look like a run of skipped offsets). A partition the
member no longer holds after a poll has its download cancelled and loads nothing; one it gains again
later is booted afresh.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from throughline.errors import ThroughlineError
from throughline.projector.cut_load import check_against_log, remove_tree, verify_cut
from throughline.projector.exceptions import SnapshotDamagedError

if TYPE_CHECKING:
    from throughline.core.owner_map import OwnerMap
    from throughline.projector.cut_manifest import CutManifest
    from throughline.projector.store import DuckProjection

log = logging.getLogger(__name__)

#: ``fetch(holder_url, partitions, out_dir, cancel)``: download the holder's snapshot of ``partitions``
#: and unpack it into the new directory ``out_dir``, bounded in time; raises a ``ThroughlineError`` when
#: it cannot, and stops early (raising) once ``cancel`` is set. Runs on a worker thread.
CutFetcher = Callable[[str, Sequence[int], Path, threading.Event], None]


@dataclass(frozen=True, slots=True)
class LogFacts:
    """What the member knows of the log when it gains a partition (checked against the snapshot)."""

    topic: str
    topic_id: str | None
    partitions: int


#: A gained partition the file holds rows of is replaced from a snapshot when it is at least this many
#: records behind the log's end. Guess, stated in docs/scale-out.md: at the ~60k records/s this machine's
#: projector replays, a million records is ~17 s of replay, more than fetching and loading a snapshot of
#: them costs; below it the log is the cheaper way.
FAR_BEHIND = 1_000_000

#: Downloads in flight at once per member. Guess, stated in docs/scale-out.md: two, so that one slow
#: holder does not hold up every other partition, while the holders are not asked to write a snapshot of
#: every gained partition at the same moment (each is a scan of their file).
PARALLEL_DOWNLOADS = 2

#: The longest a member's poll waits while a partition boots: a download or a load may end at any moment,
#: and the next load starts only at the step after a poll (a poll of paused partitions returns nothing
#: until its timeout ends). Guess, stated in docs/scale-out.md: 50 ms, against the projector's 0.5 s,
#: turns the up-to-half-second gap after each load into a few tens of ms for an empty poll or two.
BOOT_POLL_WAIT = 0.05


def wants_snapshot(applied: int, end: int, far_behind: int = FAR_BEHIND) -> bool:
    """Whether a gained partition is worth a peer's snapshot: the file holds nothing of it and the log
    holds records of it, or the file is at least ``far_behind`` records behind the log's end."""
    return (applied == 0 and end > 0) or end - applied >= max(1, far_behind)


class BootConsumer(Protocol):
    """What ``MemberBoots`` asks of the member's consumer (``throughline.log.group.GroupConsumer``)."""

    @property
    def assigned(self) -> frozenset[int]:
        """The partitions the member holds now."""
        ...

    def pause(self, partitions: Iterable[int]) -> None:
        """Fetch nothing of ``partitions`` (the held ones among them) until resumed."""
        ...

    def resume(self, partitions: Iterable[int]) -> None:
        """Fetch ``partitions`` again."""
        ...

    def seek(self, partition: int, offset: int) -> None:
        """Fetch ``partition`` from ``offset`` on."""
        ...


@dataclass(frozen=True, slots=True)
class Downloaded:
    """A holder's snapshot of one partition, downloaded and its files verified, not loaded yet; whoever
    holds it removes ``work`` (the temporary directory beside the file that holds it)."""

    holder: str
    work: Path
    manifest: CutManifest
    seconds: float

    @property
    def cut(self) -> Path:
        """The unpacked snapshot."""
        return self.work / "cut"


def download(
    partition: int, holder: str, fetch: CutFetcher, directory: Path, prefix: str, cancel: threading.Event
) -> Downloaded:
    """Fetch ``holder``'s snapshot of ``partition`` into a new temporary directory of ``directory`` and
    verify its manifest and files (on a worker thread: it touches no projection). Raises what the fetch or
    the checks raise, with the directory removed."""
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=directory))
    started = time.monotonic()
    try:
        fetch(holder, (partition,), work / "cut", cancel)
        if cancel.is_set():
            raise SnapshotDamagedError(f"the download of partition {partition} from {holder} was cancelled")
        manifest = verify_cut(work / "cut")
        if manifest.partitions != (partition,):
            raise SnapshotDamagedError(
                f"asked for partition {partition}, the snapshot holds partitions {list(manifest.partitions)}"
            )
    except BaseException:
        remove_tree(work)
        raise
    return Downloaded(holder, work, manifest, time.monotonic() - started)


class _Download:
    """One holder's snapshot of one partition, downloaded on a daemon thread of its own."""

    def __init__(self, partition: int, holder: str, run: Callable[[threading.Event], Downloaded]) -> None:
        self.partition = partition
        self.holder = holder
        self.cancel = threading.Event()
        self.result: Future[Downloaded] = Future()
        # A daemon: a stop of the process never waits for a download (its directory is removed by the
        # next start, ``MemberBoots``).
        thread = threading.Thread(target=self._run, args=(run,), name=f"member-boot-{partition}", daemon=True)
        thread.start()

    def _run(self, run: Callable[[threading.Event], Downloaded]) -> None:
        try:
            self.result.set_result(run(self.cancel))
        except BaseException as exc:  # handed to the projector's thread, which logs its code or raises it
            self.result.set_exception(exc)

    def abandon(self) -> None:
        """Cancel it: what it downloaded is removed, now or when the worker ends."""
        self.cancel.set()
        self.result.add_done_callback(_discard)


def _refused(partition: int, holder: str, exc: ThroughlineError) -> None:
    """Log a holder's snapshot of ``partition`` refused (not fetched, not sound, or not loadable here)."""
    log.warning("member bootstrap of partition %d from %s refused (%s: %s)", partition, holder, exc.code, exc.message)


def _discard(result: Future[Downloaded]) -> None:
    if result.exception() is None:
        remove_tree(result.result().work)


@dataclass(slots=True)
class _Plan:
    """A booting partition: the holders not asked yet, and the download in flight (projector's thread only)."""

    partition: int
    holders: list[str]
    started: float
    download: _Download | None = None


@dataclass(frozen=True, slots=True)
class _Loading:
    """A downloaded snapshot being loaded into the file on a worker thread of its own, which is the file's
    writer until it ends: nothing else is applied meanwhile (every held partition paused), while the
    projector's thread goes on polling."""

    partition: int
    got: Downloaded
    result: Future[int]


class MemberBoots:
    """The partitions a group member is bootstrapping from its peers' snapshots (see the module).

    Every method runs on the projector's thread, between two polls: ``gained`` with each generation's
    new partitions, ``step`` after every poll, ``close`` when the run ends.
    """

    def __init__(
        self,
        projection: DuckProjection,
        fetch: CutFetcher,
        facts: LogFacts,
        end_offset: Callable[[int], int],
        own_url: str,
        *,
        far_behind: int = FAR_BEHIND,
        parallel: int = PARALLEL_DOWNLOADS,
    ) -> None:
        """``end_offset(p)``: the log's end offset of partition ``p`` now (a ``ThroughlineError`` when the
        broker does not say); ``own_url``: this member's advertised URL (never asked)."""
        self._projection = projection
        self._fetch = fetch
        self._facts = facts
        self._end_offset = end_offset
        self._own = own_url.rstrip("/")
        self._far_behind = far_behind
        self._parallel = max(1, parallel)
        self._plans: dict[int, _Plan] = {}
        self._loading: _Loading | None = None
        self._prefix = f".{projection.path.name}.member-boot-"
        # A member killed during a download left its directory; the file has one writer, this one.
        for leftover in projection.path.parent.glob(self._prefix + "*"):
            remove_tree(leftover)

    @property
    def booting(self) -> frozenset[int]:
        """The partitions paused for a snapshot: nothing of them is applied."""
        return frozenset(self._plans)

    @property
    def loading(self) -> bool:
        """A snapshot is being loaded into the file on a worker thread: nothing at all may be applied (every
        held partition is paused; records a poll returned meanwhile are the caller's to drop, and each
        partition is sought back to the file's offset when the load ends)."""
        return self._loading is not None

    def poll_wait(self, longest: float) -> float:
        """How long the next poll may wait: ``longest``, or at most ``BOOT_POLL_WAIT`` while a partition
        boots (its download or load may end at any moment; the step after the poll carries on)."""
        return min(longest, BOOT_POLL_WAIT) if self._plans or self._loading is not None else longest

    def gained(self, consumer: BootConsumer, partitions: Iterable[int], owner_map: OwnerMap | None) -> None:
        """Pause each partition of ``partitions`` the file holds nothing of (or is far behind on) and plan
        its snapshot, holders as ``owner_map`` names them; the downloads start at ``step``."""
        if owner_map is None:
            return
        applied = self._projection.applied_offsets()
        for p in sorted(set(partitions) - set(self._plans)):
            try:
                end = self._end_offset(p)
            except ThroughlineError as exc:
                log.warning("member bootstrap of partition %d: no end offset (%s): catching up from the log", p, exc)
                continue
            if not wants_snapshot(applied.get(p, 0), end, self._far_behind):
                continue
            # A partition that moved here is named by no other member in this generation: every member is
            # asked, this generation's holders first (one that held it before has its rows).
            named = [*owner_map.urls(p), *(m.url for m in owner_map.members)]
            holders = list(dict.fromkeys(u.rstrip("/") for u in named if u.rstrip("/") != self._own))
            if holders:
                self._plans[p] = _Plan(p, holders, time.monotonic())
                log.info("member bootstrap of partition %d: paused; asking %s for a snapshot", p, holders)
        consumer.pause(self.booting)

    def step(self, consumer: BootConsumer) -> bool:
        """After a poll: cancel what the member no longer holds, finish or start a load of what was
        downloaded, start the next downloads. A partition regained inside the poll (a new partition state,
        not paused) is paused again; its records of that poll are the caller's to drop (``booting``).

        Returns whether the caller must drop everything this poll returned: a load ran at some moment of
        this step (every held partition is then sought back to the file's offset when it ends)."""
        held = consumer.assigned
        for p in sorted(set(self._plans) - held):
            plan = self._plans.pop(p)
            if plan.download is not None:
                plan.download.abandon()
            log.warning("member bootstrap of partition %d: no longer held here; nothing loaded", p)
        hold = self._loading is not None
        if self._loading is not None and self._loading.result.done():
            self._finish(consumer, self._loading)
        consumer.pause(self.booting)
        for plan in sorted(self._plans.values(), key=lambda x: x.partition):
            if self._loading is not None:
                break  # one load at a time; the other finished downloads wait for a later step
            if plan.download is not None and plan.download.result.done():
                self._take(consumer, plan, plan.download)
        in_flight = sum(1 for plan in self._plans.values() if plan.download is not None)
        for plan in sorted(self._plans.values(), key=lambda x: x.partition):
            if in_flight >= self._parallel:
                break
            if plan.download is None and not self._loads(plan.partition):
                self._start(consumer, plan)
                in_flight += plan.download is not None
        if self._loading is not None:
            consumer.pause(consumer.assigned)  # gained meanwhile too: nothing is applied during a load
        return hold or self._loading is not None

    def close(self) -> None:
        """The run ends: cancel every download (nothing more is loaded), and wait for a load running (one
        transaction: it commits whole or not at all, and the file is not closed under it)."""
        for plan in self._plans.values():
            if plan.download is not None:
                plan.download.abandon()
        self._plans.clear()
        loading, self._loading = self._loading, None
        if loading is not None:
            try:
                loading.result.exception()  # waits; what it raised was the load's, the run is ending anyway
            finally:
                remove_tree(loading.got.work)

    # ------------------------------------------------------------------------------------ internals

    def _start(self, consumer: BootConsumer, plan: _Plan) -> None:
        """Download from the next holder; with none left, catch up from the log from the file's offset."""
        if not plan.holders:
            log.warning(
                "member bootstrap of partition %d: no holder gave a snapshot; catching up from the log",
                plan.partition,
            )
            self._resume(consumer, plan.partition, self._projection.applied_offsets().get(plan.partition, 0))
            return
        holder = plan.holders.pop(0)
        p, fetch, directory, prefix = plan.partition, self._fetch, self._projection.path.parent, self._prefix
        plan.download = _Download(p, holder, lambda cancel: download(p, holder, fetch, directory, prefix, cancel))

    def _loads(self, partition: int) -> bool:
        """Whether ``partition``'s snapshot is the one being loaded."""
        return self._loading is not None and self._loading.partition == partition

    def _take(self, consumer: BootConsumer, plan: _Plan, done: _Download) -> None:
        """``done`` has finished: start loading what it downloaded on a worker thread, or log why not (the
        partition then asks its next holder)."""
        plan.download = None
        try:
            got = done.result.result()
        except ThroughlineError as exc:
            _refused(plan.partition, done.holder, exc)
            return
        replace = self._loadable(plan.partition, got)
        if replace is None:
            remove_tree(got.work)
            return
        log.warning(
            "member bootstrap of partition %d: loading the snapshot from %s (downloaded in %.1fs)",
            plan.partition,
            got.holder,
            got.seconds,
        )
        result: Future[int] = Future()
        projection, partition = self._projection, plan.partition

        def load() -> None:
            try:
                loaded = projection.load_cut_partitions(got.cut, got.manifest, replace=replace)
                result.set_result(loaded.get(partition, 0))
            except BaseException as exc:  # handed to the projector's thread, which logs its code or raises it
                result.set_exception(exc)

        # A daemon: a killed process never waits for it (one transaction: the file holds all of it or none).
        threading.Thread(target=load, name=f"member-boot-load-{partition}", daemon=True).start()
        self._loading = _Loading(partition, got, result)

    def _finish(self, consumer: BootConsumer, loading: _Loading) -> None:
        """The load ended: the partition is fetched from the snapshot's offset, every other held partition
        from the file's offset again (what was polled during the load was dropped); a refused load sends
        the partition to its next holder. An error other than a ``ThroughlineError`` is raised here, on the
        projector's thread."""
        self._loading = None
        plan = self._plans.get(loading.partition)
        offset: int | None = None
        try:
            offset = loading.result.result()
        except ThroughlineError as exc:
            _refused(loading.partition, loading.got.holder, exc)
        finally:
            remove_tree(loading.got.work)
        if plan is not None and offset is not None:
            log.warning(
                "member bootstrap: loaded partition %d from %s at offset %d in %.1fs (download %.1fs); "
                "catching up from there",
                plan.partition,
                loading.got.holder,
                offset,
                time.monotonic() - plan.started,
                loading.got.seconds,
            )
            self._resume(consumer, plan.partition, offset)
        applied = self._projection.applied_offsets()
        others = consumer.assigned - self.booting
        for p in sorted(others):
            try:
                consumer.seek(p, applied.get(p, 0))
            except ThroughlineError as exc:  # taken away meanwhile: regained, it is sought at the file's offset
                log.warning("after a snapshot's load: cannot seek partition %d to %d (%s)", p, applied.get(p, 0), exc)
        consumer.resume(others)

    def _loadable(self, partition: int, got: Downloaded) -> bool | None:
        """Check ``got`` against the log and the file now: ``None`` when it is refused (logged) or not ahead
        of the file (the partition then asks its next holder), else whether its load replaces rows the
        file holds of the partition."""
        facts = self._facts
        try:
            check_against_log(
                got.manifest,
                topic=facts.topic,
                topic_id=facts.topic_id,
                partition_count=facts.partitions,
                ends={partition: self._end_offset(partition)},
            )
        except ThroughlineError as exc:
            _refused(partition, got.holder, exc)
            return None
        applied = self._projection.applied_offsets().get(partition, 0)
        if got.manifest.next_offsets().get(partition, 0) <= applied:
            log.info("member bootstrap of partition %d: %s is not ahead of offset %d", partition, got.holder, applied)
            return None
        return applied > 0

    def _resume(self, consumer: BootConsumer, partition: int, offset: int) -> None:
        """The partition is no longer booting: fetch it from ``offset`` (the records polled while it was
        paused, if any, were dropped)."""
        del self._plans[partition]
        try:
            consumer.seek(partition, offset)
            consumer.resume([partition])
        except ThroughlineError as exc:  # taken away meanwhile: regained, it is sought at the file's offset
            log.warning("member bootstrap of partition %d: cannot seek to %d (%s)", partition, offset, exc)
