"""A group member bootstraps a partition it gains from a peer's projection snapshot
(docs/scale-out.md "A member joins: bootstrap from a peer").

When the group gives a member a partition its file holds nothing of (applied offset 0) while the log
holds records of it, or one its file is ``FAR_BEHIND`` records or more behind on, the member asks the other members the owner map names (this generation's holders of
the partition first, then every other member: a partition that moved here is named by nobody else any
more, and the member that held it before still has its rows) for their snapshot of just that partition (``CutFetcher``, supplied by ``serve``: the admin endpoint, the same
token and TLS context as ``serve --bootstrap-from``), checks it (manifest, digests, then against the log:
topic, topic id, partition count, no offset past the log's end), loads it into its own file in one
transaction (``DuckProjection.load_cut_partitions``; a far-behind partition's rows are replaced in that
same transaction) and fetches the partition from the snapshot's offset.
A member whose snapshot is not ahead of the file is skipped; any refusal or failed fetch is logged with its code
and the next member is tried; when none gives a
snapshot the member catches up from the log from offset 0, as without this.

It runs on the projector's thread, the file's only writer, between two polls: the load is a write like
any other. Guess, stated: a fetch and load longer than the group's poll interval (``MAX_POLL_INTERVAL_MS``,
30 s) makes the member leave the group and rejoin (it keeps the loaded partition: its file now holds it).
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from throughline.errors import ThroughlineError
from throughline.projector.cut_load import check_against_log, remove_tree, verify_cut
from throughline.projector.exceptions import SnapshotDamagedError

if TYPE_CHECKING:
    from throughline.projector.store import DuckProjection

log = logging.getLogger(__name__)

#: ``fetch(holder_url, partitions, out_dir)``: download the holder's snapshot of ``partitions`` and unpack
#: it into the new directory ``out_dir``; raises a ``ThroughlineError`` when it cannot.
CutFetcher = Callable[[str, Sequence[int], Path], None]


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


def wants_snapshot(applied: int, end: int, far_behind: int = FAR_BEHIND) -> bool:
    """Whether a gained partition is worth a peer's snapshot: the file holds nothing of it and the log
    holds records of it, or the file is at least ``far_behind`` records behind the log's end."""
    return (applied == 0 and end > 0) or end - applied >= max(1, far_behind)


def boot_partition(
    projection: DuckProjection,
    partition: int,
    holders: Sequence[str],
    fetch: CutFetcher,
    facts: LogFacts,
    end: int,
    applied: int = 0,
) -> int | None:
    """Load ``partition`` from the first of ``holders`` whose snapshot passes every check; returns the
    offset to fetch the partition from, or ``None`` (each refusal logged with its code) when no holder
    gave one: the caller then catches up from the log. ``applied``: the file's applied offset on it; above
    0 the file's rows of the partition are replaced, and only by a snapshot ahead of it."""
    for holder in holders:
        work = Path(tempfile.mkdtemp(prefix=f".{projection.path.name}.member-boot-", dir=projection.path.parent))
        started = time.monotonic()
        try:
            cut = work / "cut"
            fetch(holder, [partition], cut)
            manifest = verify_cut(cut)
            if manifest.partitions != (partition,):
                raise SnapshotDamagedError(
                    f"asked for partition {partition}, the snapshot holds partitions {list(manifest.partitions)}"
                )
            check_against_log(
                manifest,
                topic=facts.topic,
                topic_id=facts.topic_id,
                partition_count=facts.partitions,
                ends={partition: end},
            )
            if manifest.next_offsets().get(partition, 0) <= applied:
                log.info("member bootstrap of partition %d: %s is not ahead of offset %d", partition, holder, applied)
                continue
            offset = projection.load_cut_partitions(cut, manifest, replace=applied > 0).get(partition, 0)
        except ThroughlineError as exc:
            log.warning(
                "member bootstrap of partition %d from %s refused (%s: %s)", partition, holder, exc.code, exc.message
            )
            continue
        finally:
            remove_tree(work)
        log.warning(
            "member bootstrap: loaded partition %d from %s at offset %d in %.1fs; catching up from there",
            partition,
            holder,
            offset,
            time.monotonic() - started,
        )
        return offset
    if holders:
        log.warning("member bootstrap of partition %d: no holder gave a snapshot; catching up from the log", partition)
    return None
