"""The ``throughline`` subcommands, one module each with ``register(subparsers)``.

Its modules, one concern each:

- ``snapshot``: ``throughline snapshot`` and ``load-snapshot``, projection snapshots of a file.
"""
