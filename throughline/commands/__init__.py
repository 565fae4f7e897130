"""The ``throughline`` subcommands: each parses its flags, calls the engine, prints, and maps errors to exit codes.

The engine packages (``throughline.producers``, ``throughline.projector``, ``throughline.reader``,
``throughline.serve``, ...) never parse arguments nor print, and never import this package;
``throughline.cli`` builds the parser from these modules and turns errors into exit codes
(tests/unit/test_import_rules.py holds both rules).

Its modules, one command group each:

- ``ingest``: ``throughline ingest``, completed turns from JSON Lines or a host's transcripts to the log;
- ``hook``: ``throughline hook NAME``, a host's ``Stop`` hook (never stalls or steers the host);
- ``project``: ``throughline project`` and ``throughline replay``, the projector run on ``--db``;
- ``status``: ``throughline status``, applied against end offsets, lag, counts and quarantine (or a
  running serve's readiness with ``--url``);
- ``quarantine``: ``throughline quarantine``, the quarantined records, broken sources and repairs;
- ``repair``: ``throughline repair``, append a source repair record, or say what it would change;
- ``read``: ``throughline read`` and ``throughline observe``, pages for an auditor;
- ``token``: ``throughline token keygen|issue``, signing keys and scoped read tokens;
- ``serve``: ``throughline serve``, the projector and the HTTP read API in one process;
- ``backup``: ``throughline export`` and ``throughline import``, log backups outside Kafka;
- ``snapshot``: ``throughline snapshot`` and ``load-snapshot``, projection snapshots of a file;
- ``options``: the options the commands share (connection, remote, counts, seconds) and ``settings_from``.
"""
