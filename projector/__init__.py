"""The projector: the topic of completed turns applied to a DuckDB projection, exactly once.

Its modules and subpackages, one concern each:

- ``runner``: consume the topic and apply it to the projection, exactly once;
- ``group_runner``: the projector of one ``serve --group`` member (only the partitions it holds);
- ``feed``: where the batches come from (a ``Fetcher``, on the caller's thread or in a worker process);
- ``prepare``: decode and check the records of one partition, with no projection state (what is quarantined);
- ``pipeline``: each poll folded for readers at once, and committed on a writer thread;
- ``read_state``: everything reads need in memory, with one owner and one condition (``ReadState``), published
  as immutable snapshots;
- ``read_index``: the applied offsets, head sources and chain heads reads look up (``ReadState`` owns it);
- ``store``: the DuckDB projection (the only package that imports duckdb);
- ``periodic_check``: the check of the log every ``check_interval`` seconds, off the projector's thread;
- ``tally``: a run's running totals, reported to the progress callback;
- ``replay``: rebuild a projection from offset 0 into a new file;
- ``cut_manifest``: a projection snapshot's manifest and the checks of its files (format, SHA-256);
- ``cut_load``: take a projection snapshot, and build a new projection file from one, checked against the log;
- ``member_boot``: a group member loads a partition it gains from a peer's projection snapshot, or falls back to the log;
- ``rebuild_files``: the files of a rebuild without downtime (``serve --rebuild``), and which one a start keeps;
- ``rebuild_replay``: a rebuild's replay in a child process at a lower CPU priority, and the child itself;
- ``exceptions``: errors of the projector and its projection.
"""
