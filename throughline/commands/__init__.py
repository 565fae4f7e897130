"""The console script's subcommands. Modules: ``backup`` (``export``, ``import``)."""
