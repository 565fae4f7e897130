"""Errors of the projector and its DuckDB projection."""

from __future__ import annotations

from throughline.errors import InputError, ThroughlineError


class ProjectorError(ThroughlineError):
    """Root of the projector's errors."""

    code = "projector_error"


class ProjectionBusyError(ProjectorError):
    """Another process (a running projector) holds the projection file's write lock.

    Retriable: it succeeds once that process stops.
    """

    code = "projection_busy"
    retriable = True


class ProjectionMissingError(ProjectorError):
    """A read-only open of a projection file that does not exist (or is not a projection yet)."""

    code = "projection_missing"


class ProjectionIncompatibleError(ProjectorError):
    """The file is not a throughline projection, or one of another schema version."""

    code = "projection_incompatible"


class ProjectionReadOnlyError(ProjectionIncompatibleError):
    """A write asked of a projection opened read-only."""

    code = "projection_read_only"


class PartitionCountChangedError(ProjectorError):
    """The topic has another partition count than the projection was built with: projects moved between
    partitions, so their order is lost."""

    code = "partition_count_changed"


class ReplayInterruptedError(ProjectorError):
    """A replay was stopped before it reached the end offsets; nothing was written."""

    code = "replay_interrupted"


class ReplayProcessError(ProjectorError):
    """A rebuild's replay in its child process failed, died, or did not stop when asked (``serve`` reports
    the rebuild failed; the live file keeps serving)."""

    code = "replay_process_failed"


class ProjectionTopicMismatchError(ProjectorError):
    """The projection was built from another topic than the one this call names (a settings mistake)."""

    code = "projection_topic_mismatch"
    exit_code = 2


class LogRewoundError(ProjectorError):
    """The log is not the one the projection was built from.

    A partition's end offset is lower than the offset the projection already applied, the topic's id
    differs from the recorded one, or the topic was deleted under a running projector: the topic was
    deleted and recreated, or the settings point at another cluster. The projector stops rather than
    mixing two histories; rebuild with ``throughline replay --db NEW_FILE``.
    """

    code = "log_rewound"


class LogTruncatedError(ProjectorError):
    """Records the projection has not applied yet are gone from the log (retention or record deletion).

    Applying what is left would silently skip turns, so the projector stops.
    """

    code = "log_truncated"


class ReplayTargetError(ProjectorError):
    """``replay --db`` names a file that already holds data (replay only writes into a new file)."""

    code = "replay_target_exists"
    exit_code = 2


class InvalidBatchError(ProjectorError):
    """A batch handed to the apply path breaks its rules (mixed partitions, offsets not ascending)."""

    code = "invalid_batch"


class ProjectionStorageError(ProjectorError):
    """The projection file could not be written (disk full, read-only, permissions).

    Nothing of the batch was applied (its transaction rolled back), so the applied offsets did not
    advance; once the storage is writable again, a restart resumes exactly where it stopped.
    """

    code = "projection_storage_failed"


class FetchWorkerError(ProjectorError):
    """The fetch worker process failed or died; it is started again from the applied offsets.

    Defined here, not in the worker's modules: an error the worker sends crosses the pipe pickled, and
    only a class of an importable module (never ``__main__``) can be loaded by the parent.
    """

    code = "fetch_worker_failed"
    retriable = True


class ProjectionSnapshotError(ProjectorError):
    """A projection snapshot (``throughline snapshot``, docs/operations.md "Projection snapshots") cannot
    be taken or loaded: the root of the refusals below, each with its own code."""

    code = "projection_snapshot_refused"
    exit_code = 2


class SnapshotDamagedError(ProjectionSnapshotError):
    """A snapshot's manifest does not parse, a file it names is missing, or a file's SHA-256 or row count
    differs from the manifest's (a damaged or partial copy)."""

    code = "projection_snapshot_damaged"


class SnapshotVersionError(ProjectionSnapshotError):
    """A snapshot of a format version or projection schema version this throughline does not load."""

    code = "projection_snapshot_unsupported"


class SnapshotLogMismatchError(ProjectionSnapshotError):
    """A snapshot of another log: another topic name, topic id (the topic was recreated, or another
    cluster) or partition count than the log it would be caught up from."""

    code = "projection_snapshot_log_mismatch"


class SnapshotAheadOfLogError(ProjectionSnapshotError):
    """A snapshot whose applied offsets are past the log's end offsets: it holds records this log does not
    (a stale cluster, a truncated topic), so catching up from it would mix two histories."""

    code = "projection_snapshot_ahead_of_log"


class SnapshotTargetError(ProjectionSnapshotError):
    """A snapshot is only loaded into a projection file that does not exist yet, and only written into an
    output directory that is empty or new."""

    code = "projection_snapshot_target_exists"


class SnapshotPartitionsError(ProjectionSnapshotError, InputError):
    """``--partitions`` names a partition the projection's topic does not have, or the projection has not
    recorded its topic's partition count yet (no projector ran on it)."""

    code = "projection_snapshot_partitions"
