"""Subcommands of log backups: ``export`` and ``import`` (docs/operations.md, "Backup and restore").

- ``throughline export --out DIR [--partitions 0,3,...]``: the topic's committed records into Avro files
  in ``DIR`` (resuming the backup already there), up to the end offsets taken at the start; progress
  (records/s per partition) on stderr, a JSON summary on stdout.
- ``throughline import DIR --topic NEW [--partitions ...] [--resume]``: a verified backup into a new
  topic with the same partition count; the same progress and summary.

The work is ``throughline.backup``'s; this module parses, prints and maps a stop (SIGTERM/SIGINT) to
the engine's stop event.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any, TextIO

from throughline.commands.options import add_replication_options, replication_overrides, settings_from
from throughline.errors import Interrupted
from throughline.log.config import ENV_KAFKA_CONFIG
from throughline.runtime import StopOnSignals
from throughline.settings import DEFAULT_TOPIC, ENV_BOOTSTRAP, ENV_TOPIC


def register(subparsers: Any) -> None:
    """Add ``export`` and ``import`` to the ``throughline`` parser."""
    export = subparsers.add_parser(
        "export",
        help="back the topic's records up into Avro files (resumable)",
        description="Write the topic's committed records byte for byte (key, value, headers, offset, timestamp) "
        "into Avro object container files in DIR, one series per partition, with a manifest of SHA-256 digests. "
        "Resumes the backup already in DIR; stops at the end offsets taken when it starts.",
    )
    export.add_argument(
        "--out", required=True, metavar="DIR", help="the backup folder (created; resumed when it holds one)"
    )
    _add_common(export)
    export.set_defaults(func=_cmd_export)

    restore = subparsers.add_parser(
        "import",
        help="write a log backup into a new topic",
        description="Verify the backup in DIR (every file's SHA-256), create the topic NEW with the backup's partition "
        "count, and write each partition's records in order to the same partition (keys, values, headers, "
        "timestamps as CreateTime). Refuses an existing topic that holds records, unless --resume.",
    )
    restore.add_argument("backup", metavar="DIR", help="the backup folder (as `throughline export --out` wrote it)")
    _add_common(
        restore, topic_help="the NEW topic to write (required: an import never falls back to the default topic)"
    )
    restore.add_argument("--resume", action="store_true", help="continue an import into NEW that stopped")
    restore.add_argument(
        "--allow-incomplete",
        action="store_true",
        help="import a backup whose export stopped before its end offsets (what it holds)",
    )
    add_replication_options(restore)
    restore.set_defaults(func=_cmd_import)


def _add_common(parser: argparse.ArgumentParser, *, topic_help: str | None = None) -> None:
    group = parser.add_argument_group("connection")
    group.add_argument("--bootstrap-servers", default=None, help=f"Kafka bootstrap servers (env {ENV_BOOTSTRAP})")
    group.add_argument(
        "--kafka-config",
        default=None,
        metavar="FILE",
        help=f"Kafka client properties file (env {ENV_KAFKA_CONFIG}; see docs/kafka.md)",
    )
    if topic_help is None:
        group.add_argument(
            "--topic", default=None, help=f"the topic to export (env {ENV_TOPIC}, default {DEFAULT_TOPIC})"
        )
    else:
        group.add_argument("--topic", required=True, metavar="NEW", help=topic_help)
    parser.add_argument(
        "--partitions",
        type=_partition_list,
        default=None,
        metavar="0,3,...",
        help="only these partitions (default: all)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")


def _partition_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of partition numbers: {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"not a list of partition numbers (0 or more): {text!r}")
    return values


class ProgressLines:
    """Progress on a stream (stderr): redrawn in place on a terminal, a line every few seconds otherwise.
    Each partition shows how far it is and its records/s."""

    def __init__(self, verb: str, stream: TextIO | None = None, *, line_interval: float = 5.0) -> None:
        self._verb = verb
        self._stream = stream or sys.stderr
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._interval = 0.2 if self._tty else line_interval
        self._last = 0.0
        self._drawn = False

    def __call__(self, update: Any) -> None:
        now = time.monotonic()
        if now - self._last >= self._interval:
            self._last = now
            self.draw(update)

    def draw(self, update: Any) -> None:
        """Write the state of ``update`` (a ``CopyProgress``) now."""
        seconds = max(update.elapsed, 1e-6)
        parts = " ".join(
            f"p{p.partition} {p.records:,} ({p.records / seconds:,.0f}/s){' done' if p.done else ''}"
            for p in update.partitions
        )
        text = f"{self._verb} {update.fraction * 100:5.1f}% {parts}"
        if self._tty:
            self._stream.write("\r\x1b[K" + text)
            self._drawn = True
        else:
            self._stream.write(text + "\n")
        self._stream.flush()

    def finish(self, update: Any | None) -> None:
        """Draw the final state (when known) and end the line."""
        if update is not None:
            self.draw(update)
        if self._tty and self._drawn:
            self._stream.write("\n")
            self._stream.flush()


def _run(verb: str, args: argparse.Namespace, work: Any) -> Any:
    """Run ``work(progress=..., stop=...)`` with progress lines and SIGTERM/SIGINT as its stop."""
    lines = None if args.no_progress else ProgressLines(verb)
    last: list[Any] = []

    def progress(update: Any) -> None:
        last[:] = [update]
        if lines is not None:
            lines(update)

    stop = threading.Event()
    with StopOnSignals(lambda _: stop.set()):
        try:
            return work(progress=progress, stop=stop)
        finally:
            if lines is not None:
                lines.finish(last[0] if last else None)


def _cmd_export(args: argparse.Namespace) -> int:
    from throughline.backup import export_log

    settings = settings_from(args)
    servers = settings.require_bootstrap()
    kafka_config = settings.kafka_config()
    summary = _run(
        "export",
        args,
        lambda **kw: export_log(
            servers, settings.topic, args.out, partitions=args.partitions, kafka_config=kafka_config, **kw
        ),
    )
    ends = ", ".join(f"p{p} {e}" for p, e in sorted(summary.end_offsets.items()))
    if summary.complete:
        print(
            f"export: stopped at the end offsets taken at its start ({ends}); later records wait for the next run",
            file=sys.stderr,
        )
    print(json.dumps({"out": args.out, **summary.to_json()}))
    if not summary.complete:
        raise Interrupted(f"export into {args.out} stopped before its end offsets; what was written is kept and listed")
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from throughline.backup import import_backup

    settings = settings_from(args)
    servers = settings.require_bootstrap()
    kafka_config = settings.kafka_config()
    rf, isr = replication_overrides(args)
    summary = _run(
        "import",
        args,
        lambda **kw: import_backup(
            servers,
            args.backup,
            settings.topic,
            partitions=args.partitions,
            resume=args.resume,
            allow_incomplete=args.allow_incomplete,
            kafka_config=kafka_config,
            replication_factor=rf,
            min_insync_replicas=isr,
            **kw,
        ),
    )
    print(json.dumps({"backup": args.backup, **summary.to_json()}))
    if not summary.complete:
        raise Interrupted(
            f"import into {settings.topic} stopped before the end of the backup; run it again with --resume"
        )
    return 0
