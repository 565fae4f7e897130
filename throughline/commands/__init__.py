"""The console script's subcommands, one module per group of commands (each has ``register(subparsers)``)."""
