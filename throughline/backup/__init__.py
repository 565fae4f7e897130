"""Log backups outside Kafka: a topic's committed records in Avro files, and back into a new topic.

Its modules, one concern each:

- ``files``: the data files (Avro object container files of ``schemas/log_backup_record.v1.avsc``),
  written block by block, and a torn last block found and cut off after a crash;
- ``manifest``: ``manifest.json``, what the folder holds (ranges, files, SHA-256) and where an export resumes;
- ``export``: ``export_log``, a topic's partitions up to the end offsets taken at the start, resumable;
- ``restore``: ``import_backup``, a verified backup into a new topic, each partition in order, resumable;
- ``progress``: how far a run is, per partition (what the progress callbacks get);
- ``exceptions``: the errors of log backups.

No argparse and no printing here: ``throughline.commands.backup`` is the command line. The records are
read and written by the Kafka edge (``throughline.log.record_copy``). docs/operations.md, "Backup and
restore", is the operator's guide.
"""

from __future__ import annotations

from throughline.backup.export import ExportSummary, export_log
from throughline.backup.manifest import Manifest, load_manifest
from throughline.backup.progress import CopyProgress, PartitionProgress
from throughline.backup.restore import ImportSummary, import_backup

__all__ = [
    "CopyProgress",
    "ExportSummary",
    "ImportSummary",
    "Manifest",
    "PartitionProgress",
    "export_log",
    "import_backup",
    "load_manifest",
]
