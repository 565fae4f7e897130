"""When a writable projection file reaches the disk: commits go to DuckDB's WAL without an ``fsync``,
checkpoints (the WAL written into the file) with one.

Why. The projection is a function of the log, and every transaction commits the rows it writes
together with the applied offsets they advance (``applied_offsets``, the tracking row). What a
commit must survive is the projector's own death (SIGKILL, out of memory, a failed host process):
the bytes DuckDB wrote are then in the operating system's page cache and reach the file whatever
happens to the process, ``fsync`` or not. An ``fsync`` only adds protection against the operating
system itself stopping (a kernel crash, a power loss), and it cost the freshness of every read: on
this project's machines a WAL ``fsync`` takes 0.3 ms at the median but 50-150 ms at the 99th
percentile and up to ~0.5 s while Kafka writes beside it, and each turn is readable only after its
commit returned (measured with ``python -m bench --only freshness``: ack -> readable p99 at 10
turns/s 180-460 ms with an ``fsync`` a commit, 18-22 ms without). Kafka Streams makes the same
choice for its RocksDB stores (their WAL is off; the changelog topic is the durable copy).

What stays synced. A checkpoint rewrites blocks of the database file; an unsynced one interrupted by
a power loss could leave the file's header pointing at blocks that never reached the disk (DuckDB's
``fsync_mode = NONE`` warns of exactly that). So DuckDB's automatic checkpoint is switched off on a
writable handle, and ``after_commit`` runs the checkpoint itself once the WAL reaches the handle's
threshold, with ``fsync_mode`` back at ``STANDARD`` for its duration; ``before_close`` does the same
for the checkpoint DuckDB runs when the handle closes, and ``checkpoint`` (replay's, before it renames
its result) is synced too.

The guarantee, then: a crash of the process at any instant loses and duplicates nothing (as before).
An operating-system crash or power loss can lose the transactions committed since the last checkpoint
(DuckDB replays the WAL up to its last complete entry); the file then holds an earlier, consistent
state with its own applied offsets, and the projector re-applies those records from the log. Readers
who were served a turn that went back may get ``projection_pending`` for it until it is re-applied,
never another chain. ``sync_commits=True`` (``--sync-commits`` on ``project`` and ``serve``) restores
an ``fsync`` at every commit (DuckDB's own automatic checkpoints then run as usual).
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from throughline.projector.exceptions import ProjectionStorageError
from throughline.projector.store.files import STORAGE_FAULTS, wal_path

#: A writable handle checkpoints its WAL into the file when the WAL reaches this size. DuckDB's default
#: (16 MiB) checkpoints every ~12k turns of 1 KB under sustained ingest: measured on 200k turns, commits
#: took 4.5 s at 16 MiB and 1.8 s at 256 MiB. With the projector's memory limit, 128 MiB cost ~10% more
#: CPU than 256 MiB with no limit, for half the peak memory (~390 MiB instead of ~760 MiB at 300k turns).
DEFAULT_WAL_AUTOCHECKPOINT = 128 * 1024 * 1024
#: ``wal_autocheckpoint`` that never triggers: the handle checkpoints itself (``after_commit``).
_NEVER = "1000TB"
#: DuckDB's string compressions a writable handle does not try (``disabled_compression_methods``). A
#: checkpoint tries every enabled one on each string segment, and reads of the table being checkpointed
#: wait for it. On turn bodies of prose (1 KB, 60k turns) DICT_FSST won the analysis and compressed them
#: 1.7x, and the checkpoint took 730 ms instead of 108 (uncompressed); on the benchmark's bodies it is
#: tried and refused, and the analysis alone cost ~10% of each checkpoint. A projection is a view that
#: replay rebuilds: its freshness and write rate are worth more than its size. Names DuckDB versions
#: before 1.3 do not know are left out (``skip_costly_compression``).
SKIPPED_COMPRESSIONS = ("dict_fsst", "fsst")


class CommitDurability:
    """The fsync policy of one writable projection handle (see the module's docstring)."""

    def __init__(self, path: Path, *, wal_bytes: int, sync_commits: bool = False) -> None:
        self.wal_path = wal_path(path)
        self.wal_bytes = max(1, int(wal_bytes))
        self.sync_commits = sync_commits

    def configure(self, con: duckdb.DuckDBPyConnection) -> None:
        """Set the handle's ``fsync_mode``, automatic checkpoint size and string compressions (once, at open)."""
        skip_costly_compression(con)
        if self.sync_commits:
            con.execute("SET fsync_mode = 'STANDARD'")
            con.execute(f"SET wal_autocheckpoint = '{int(self.wal_bytes)}B'")
        else:
            con.execute("SET fsync_mode = 'NONE'")
            con.execute(f"SET wal_autocheckpoint = '{_NEVER}'")

    def wal_size(self) -> int:
        """Bytes in the WAL now (0 when there is none)."""
        try:
            return self.wal_path.stat().st_size
        except FileNotFoundError:
            return 0

    def after_commit(self, cur: duckdb.DuckDBPyConnection) -> bool:
        """Checkpoint, synced, when the WAL reached the threshold; whether it did. Called by the writer
        after each commit, outside any transaction."""
        if self.sync_commits or self.wal_size() < self.wal_bytes:
            return False
        try:
            self.checkpoint(cur)
        except duckdb.TransactionException:
            # A reader's snapshot is open (DuckDB: "Cannot CHECKPOINT: there are other write transactions
            # active"); ``FORCE CHECKPOINT`` waits for it and hung beside readers that keep reading. The
            # WAL keeps what was applied: try again after a later commit.
            return False
        except STORAGE_FAULTS as exc:
            raise ProjectionStorageError(
                f"cannot checkpoint the projection's WAL {self.wal_path}: {type(exc).__name__}: {exc}; what was "
                "applied is in the WAL: free space or fix permissions, then start the projector again"
            ) from exc
        return True

    def checkpoint(self, cur: duckdb.DuckDBPyConnection) -> None:
        """``CHECKPOINT`` with ``fsync_mode = STANDARD`` for its duration."""
        if self.sync_commits:
            cur.execute("CHECKPOINT")
            return
        cur.execute("SET fsync_mode = 'STANDARD'")
        try:
            cur.execute("CHECKPOINT")
        finally:
            cur.execute("SET fsync_mode = 'NONE'")

    def before_close(self, con: duckdb.DuckDBPyConnection) -> None:
        """Let the checkpoint DuckDB runs when the handle closes reach the disk (best effort: a handle
        closed after a storage fault closes anyway, and the next open replays the WAL)."""
        try:
            con.execute("SET fsync_mode = 'STANDARD'")
        except duckdb.Error:
            pass


def skip_costly_compression(con: duckdb.DuckDBPyConnection) -> None:
    """Disable ``SKIPPED_COMPRESSIONS`` on ``con``'s database for its checkpoints (the names this DuckDB
    does not know are left out one by one: an unknown name fails the whole setting)."""
    known: list[str] = []
    for method in SKIPPED_COMPRESSIONS:
        try:
            con.execute(f"SET disabled_compression_methods = '{','.join((*known, method))}'")
        except duckdb.Error:
            continue
        known.append(method)  # the setting now holds every method known so far
