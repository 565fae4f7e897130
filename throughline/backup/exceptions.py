"""Errors of log backups (``throughline export`` and ``throughline import``; docs/operations.md)."""

from __future__ import annotations

from throughline.errors import InputError, ThroughlineError


class BackupError(ThroughlineError):
    """Root of the errors of log backups."""

    code = "backup_error"


class BackupDamagedError(BackupError, InputError):
    """The backup folder is not a whole backup: its manifest is missing or unreadable, a file it lists
    is missing or its SHA-256 differs, or a file's records are not what the manifest says. An import
    refuses it before writing anything."""

    code = "backup_damaged"


class BackupTopicMismatchError(BackupError, InputError):
    """An export into a folder holding another log's backup: another topic name, topic id or partition
    count, or a log whose end is now below what the backup already holds."""

    code = "backup_topic_mismatch"


class BackupFolderError(BackupError, InputError):
    """The backup folder cannot be used: ``--out`` names a file, or the folder cannot be created or written."""

    code = "backup_folder_invalid"


class BackupLogGapError(BackupError):
    """The log no longer holds the records an export would resume from (deleted by retention): the
    backup would have a gap. Start a new backup in an empty folder."""

    code = "backup_log_gap"


class BackupIncompleteError(BackupError, InputError):
    """An import of a backup whose export did not reach its end offsets on a partition (it was
    interrupted): resume the export, or import it as it is with ``--allow-incomplete``."""

    code = "backup_incomplete"


class ExportStalledError(BackupError):
    """An export read nothing for too long before reaching its end offsets (the broker stopped
    answering fetches). What was written is kept: run it again to resume."""

    code = "export_stalled"
    retriable = True


class ImportTargetNotEmptyError(BackupError, InputError):
    """An import into a topic that already holds records (without ``--resume``): an import only writes
    a new topic."""

    code = "import_target_not_empty"


class ImportTargetMismatchError(BackupError, InputError):
    """An import into an existing topic that cannot be this backup's copy: another partition count, more
    records on a partition than the backup has, or (with ``--resume``) a last record that differs from
    the backup's record at that position."""

    code = "import_target_mismatch"


class ImportRecordUnsupportedError(BackupError, InputError):
    """The backup holds a record the import's Kafka client cannot write as it is (a header with a null
    value, or neither key nor value): refused before anything is written, rather than changed."""

    code = "import_record_unsupported"
