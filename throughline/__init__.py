"""throughline: completed agent turns on a Kafka log, projected into DuckDB, read by an Observer.

Its modules and subpackages, one concern each:

- ``core``: the pure core (turns, chains, cursors, page tokens, the fold) and its ports;
- ``log``: the Kafka edge shared by producers, projector and reader;
- ``serve``: ``throughline serve``, the projector and the HTTP read API in one process;
- ``backup``: log backups outside Kafka (``throughline export`` and ``import``);
- ``testing``: test support (a real Kafka broker, throughline in a container, the host adapters' kit);
- ``commands``: the ``throughline`` subcommands (parse, call the engine, print, exit codes);
- ``cli``: the ``throughline`` console script, built from ``commands``;
- ``errors``: the root of every error throughline raises;
- ``settings``: connection settings shared by every command (flags, then the environment, then defaults;
  the flags are ``commands.options``');
- ``runtime``: process-level behaviour shared by every command (GC tuning, signals, dying with the parent);
- ``durable``: replacing a small file so that a crash keeps the old or the new.

The source folders producers/, projector/, reader/ and schemas/ install as the subpackages
``throughline.producers``, ``throughline.projector``, ``throughline.reader`` and ``throughline.schemas``
(pyproject.toml's package-dir mapping).
"""
