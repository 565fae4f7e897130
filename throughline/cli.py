"""The ``throughline`` console script: one entry point, one subcommand per job (docs/spec.md#command-line).

Each module of ``throughline.commands`` registers its own subcommands (``register(subparsers)``); this
module only builds the parser and turns errors into exit codes:

- 0: the command did its job (a read answered ``projection_pending`` or ``resync_required`` did its job);
- 2: a hard input error, with ``{"error": {"code", "message"}}`` as JSON on stderr;
- 1: any other failure, reported the same way;
- 130: interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from typing import NoReturn

from throughline.errors import Interrupted, InvalidArgumentsError, ThroughlineError

# Modules that contribute subcommands; each has ``register(subparsers) -> None``. The order is the
# order of the subcommands in ``throughline --help``.
_COMMAND_MODULES = (
    "throughline.commands.ingest",
    "throughline.commands.hook",
    "throughline.commands.project",
    "throughline.commands.status",
    "throughline.commands.quarantine",
    "throughline.commands.repair",
    "throughline.commands.read",
    "throughline.commands.token",
    "throughline.commands.serve",
    "throughline.commands.snapshot",
    "throughline.commands.backup",
)


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors follow the contract: JSON on stderr, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        emit_error(InvalidArgumentsError(f"{self.prog}: {message}"))
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser."""
    parser = _Parser(
        prog="throughline",
        description="Completed agent turns on a Kafka log, projected into DuckDB, read by an auditing Observer.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):  # that part is not built yet
                continue
            raise
        module.register(subparsers)
    return parser


def emit_error(error: ThroughlineError) -> None:
    """Print an error as one JSON document on stderr."""
    print(json.dumps(error.to_json(), ensure_ascii=False), file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["hook"]:
        from throughline.commands.hook import hook_argv

        argv = hook_argv(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        if argv[:1] == ["hook"] and exc.code == 2:
            return 1  # a host takes exit 2 from its Stop hook as "keep going": a hook never says 2
        raise
    try:
        code = args.func(args)
    except ThroughlineError as exc:
        emit_error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        print(json.dumps(Interrupted("interrupted").to_json()), file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
    return int(code or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
