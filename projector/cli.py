"""Subcommands of the projector: ``project``, ``replay`` and ``status`` (docs/spec.md#command-line).

- ``throughline project [--until-caught-up]``: run the projector on ``--db``; with the flag, exit once
  every partition's applied offset reaches the end offset seen at start. Prints a JSON summary on
  stdout when it stops (SIGTERM/SIGINT stop it after the batch in flight is committed).
- ``throughline replay --db NEW_FILE``: rebuild the projection from offset 0 into a new file, with a
  progress bar on stderr and a JSON summary on stdout (records, turns, duplicates, quarantined, rate).
- ``throughline status [--json]``: applied and end offsets and lag per partition, counts, and the
  latest quarantined records (a table, or one JSON document with ``--json``).
- ``throughline quarantine [--json] [--project P]``: every quarantined record, broken source and repair,
  hashes only (``throughline.projector.quarantine``).
- ``throughline repair --project P (--host H --thread T | --source SHA256) --reason TEXT [--dry-run]``:
  append a source repair record to the project's partition, or say what it would change
  (``throughline.projector.repair``; docs/operations.md).

Errors are raised as typed ``ThroughlineError``s; ``throughline.cli`` prints them as JSON on stderr and
exits 2 for input/configuration errors, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar

from throughline.runtime import StopOnSignals
from throughline.serve.client import ENV_URL, add_http_options
from throughline.settings import add_connection_options, add_sync_commits, settings_from

T = TypeVar("T")


def register(subparsers: Any) -> None:
    """Add ``project``, ``replay``, ``status``, ``quarantine`` and ``repair`` to the ``throughline`` parser."""
    project = _command(
        subparsers,
        "project",
        _cmd_project,
        help="run the projector (Kafka -> DuckDB, exactly once)",
        description="Consume the topic of completed turns into the DuckDB projection, exactly once.",
    )
    project.add_argument(
        "--until-caught-up",
        action="store_true",
        help="exit once the end offsets seen at start are applied",
    )
    add_sync_commits(project)
    _add_tuning(project)

    replay = _command(
        subparsers,
        "replay",
        _cmd_replay,
        help="rebuild a projection from offset 0 into a new file",
        description="Replay the topic from offset 0 into a NEW DuckDB file (refuses an existing, non-empty file).",
    )
    replay.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    _add_tuning(replay)

    status = _command(
        subparsers,
        "status",
        _cmd_status,
        help="applied vs end offsets, lag, counts and quarantine",
        description="Report the projection's applied offsets against the log's end offsets, counts and quarantine.",
    )
    _add_json_flag(status)
    status.add_argument("--quarantine", type=int, default=10, metavar="N", help="latest quarantined records to show")
    add_http_options(status, status=True)

    quarantine = _command(
        subparsers,
        "quarantine",
        _cmd_quarantine,
        help="quarantined records, broken sources and repairs (hashes only)",
        description="List the projection's quarantined records (position, reason code and text, source and "
        "project hashes, when), its broken sources with counts, and the repairs applied. Reads --db.",
    )
    _add_json_flag(quarantine)
    quarantine.add_argument("--project", default=None, metavar="P", help="only this project (its name; it is hashed)")

    repair = _command(
        subparsers,
        "repair",
        _cmd_repair,
        help="append a repair record that un-breaks a source (see docs/operations.md)",
        description="Append a source repair record to the project's partition: when the projector applies "
        "it, the source's chain as applied is accepted and served again, and its quarantined records are "
        "marked repaired. --dry-run reads --db and prints what would change, appending nothing.",
    )
    repair.add_argument("--project", required=True, metavar="P", help="the project (its name; it is hashed)")
    repair.add_argument("--host", default=None, metavar="H", help="the source's host (with --thread; hashed)")
    repair.add_argument("--thread", default=None, metavar="T", help="the source's thread (with --host; hashed)")
    repair.add_argument(
        "--source",
        default=None,
        metavar="SOURCE_SHA256",
        help="the source's hash, as `throughline quarantine` prints it",
    )
    repair.add_argument("--reason", required=True, metavar="TEXT", help="why the chain as applied is accepted")
    repair.add_argument("--dry-run", action="store_true", help="print what the repair would change; append nothing")


def _command(
    subparsers: Any, name: str, func: Callable[[argparse.Namespace], int], *, help: str, description: str
) -> argparse.ArgumentParser:
    """A subcommand run by ``func`` that reads the connection options (every command here does)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(name, help=help, description=description)
    add_connection_options(parser)
    parser.set_defaults(func=func)
    return parser


def _add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")


def _add_tuning(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tuning")
    group.add_argument("--max-poll-records", type=int, default=None, metavar="N", help="records per poll/transaction")
    group.add_argument(
        "--check-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how often the log's identity is re-checked",
    )
    group.add_argument(
        "--memory-mb",
        type=int,
        default=None,
        metavar="MB",
        help="DuckDB memory beyond its indexes, which keeps the process's memory flat "
        "(default 128; 0 = DuckDB's default, 80%% of RAM)",
    )
    group.add_argument(
        "--no-fetch-worker",
        action="store_true",
        help="fetch and decode on the projector's own thread instead of a worker process (one core)",
    )
    group.add_argument("-v", "--verbose", action="store_true", help="log what the projector does on stderr")


def _options(args: argparse.Namespace) -> Any:
    from throughline.errors import InvalidArgumentsError
    from throughline.projector.runner import ProjectorOptions

    options = ProjectorOptions()
    if args.max_poll_records is not None:
        if args.max_poll_records < 1:
            raise InvalidArgumentsError("--max-poll-records must be at least 1")
        options = replace(options, max_poll_records=args.max_poll_records)
    if args.check_interval is not None:
        if not args.check_interval > 0:
            raise InvalidArgumentsError("--check-interval must be positive")
        options = replace(options, check_interval=args.check_interval)
    if args.no_fetch_worker:
        options = replace(options, fetch_worker=False)
    return options


def _memory_headroom(args: argparse.Namespace) -> int | None:
    from throughline.errors import InvalidArgumentsError
    from throughline.projector.store import DEFAULT_MEMORY_HEADROOM

    if args.memory_mb is None:
        return DEFAULT_MEMORY_HEADROOM
    if args.memory_mb < 0:
        raise InvalidArgumentsError("--memory-mb must be 0 or more")
    return args.memory_mb * 1024 * 1024 or None


def _logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # kafka-python logs routine reconnects and slow event-loop ticks as warnings.
    logging.getLogger("kafka").setLevel(logging.INFO if verbose else logging.ERROR)


@contextmanager
def _stop_on_signals() -> Iterator[tuple[threading.Event, StopOnSignals]]:
    """An event set by SIGTERM/SIGINT (graceful stop after the batch in flight; a second signal too)."""
    stop = threading.Event()
    with StopOnSignals(lambda _: stop.set(), lambda _: stop.set()) as signals:
        yield stop, signals


def _cmd_project(args: argparse.Namespace) -> int:
    from throughline.projector.runner import Projector
    from throughline.projector.store import DuckProjection

    _logging(args.verbose)
    settings = settings_from(args)
    servers = settings.require_bootstrap()
    options = _options(args)
    headroom = _memory_headroom(args)
    kafka_config = settings.kafka_config()  # a broken file fails before the projection is opened
    with (
        DuckProjection.open(
            settings.db, topic=settings.topic, memory_headroom=headroom, sync_commits=args.sync_commits
        ) as projection,
        _stop_on_signals() as (stop, signals),
    ):
        projector = Projector(projection, servers, settings.topic, options=options, kafka_config=kafka_config)
        summary = _run_riding_out_outages(
            lambda: projector.run(until_caught_up=args.until_caught_up, stop=stop),
            stop,
            wait_for_topic=not args.until_caught_up,
        )
    if summary is None:  # asked to stop while waiting for the broker to come back
        print(json.dumps({"db": settings.db, "topic": settings.topic, "stopped": True}))
        return signals.exit_code
    print(json.dumps({"db": settings.db, "topic": settings.topic, **summary.to_json()}))
    return signals.exit_code


#: How long ``project`` rides out a broker that is away (retriable failures) before it gives up.
OUTAGE_WINDOW = 300.0
#: The longest wait between two attempts: a restarted broker is noticed within this many seconds.
OUTAGE_RETRY_MAX = 10.0


def _run_riding_out_outages(run: Callable[[], T], stop: threading.Event, *, wait_for_topic: bool = True) -> T | None:
    """Run ``run``; after a retriable failure (the broker went away) wait and run it again.

    Safe because every batch is committed whole and the projector seeks to its applied offsets on each
    start. Backoff 1 s doubling to ``OUTAGE_RETRY_MAX``; a failure that persists for ``OUTAGE_WINDOW`` seconds, or any
    failure that is not retriable, is raised. A missing topic is waited for only with
    ``wait_for_topic`` (a long-running projector may start before the first producer creates it; a
    run ``--until-caught-up`` has nothing to catch up with). ``None`` when asked to stop meanwhile.
    """
    from throughline.errors import ThroughlineError
    from throughline.log.exceptions import TopicMissingError

    backoff, failing_since = 1.0, None
    while True:
        try:
            return run()
        except ThroughlineError as exc:
            if not exc.retriable or stop.is_set() or (isinstance(exc, TopicMissingError) and not wait_for_topic):
                raise
            now = time.monotonic()
            failing_since = now if failing_since is None else failing_since
            if now - failing_since > OUTAGE_WINDOW:
                raise
            print(
                json.dumps({"warning": {"code": exc.code, "message": exc.message, "retryInSeconds": backoff}}),
                file=sys.stderr,
                flush=True,
            )
            if stop.wait(backoff):
                return None
            backoff = min(backoff * 2, OUTAGE_RETRY_MAX)


def _cmd_replay(args: argparse.Namespace) -> int:
    from throughline.projector.replay import ProgressBar, replay

    _logging(args.verbose)
    settings = settings_from(args)
    servers = settings.require_bootstrap()
    options = _options(args)
    bar = None if args.no_progress else ProgressBar()
    last: list[Any] = []

    def progress(update: Any) -> None:
        last[:] = [update]
        if bar is not None:
            bar(update)

    with _stop_on_signals() as (stop, signals):
        try:
            summary = replay(
                servers,
                settings.topic,
                settings.db,
                progress=progress,
                stop=stop,
                options=options,
                memory_headroom=_memory_headroom(args),
                kafka_config=settings.kafka_config(),
            )
        finally:
            if bar is not None:
                bar.finish(last[0] if last else None)
    doc = {"db": settings.db, "topic": settings.topic, **summary.to_json()}
    if not summary.caught_up:
        doc["interrupted"] = True
        print(json.dumps(doc))
        from throughline.projector.exceptions import ReplayInterruptedError

        raise ReplayInterruptedError(
            f"replay into {settings.db} was interrupted before it reached the end offsets; nothing was written",
        )
    print(json.dumps(doc))
    return signals.exit_code


def _cmd_status(args: argparse.Namespace) -> int:
    if args.url or os.environ.get(ENV_URL):  # a running serve (or a group's members) holds the file
        from throughline.serve.remote_status import remote_status

        return remote_status(args)
    from throughline.projector.status import collect_status, render_status

    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    settings = settings_from(args)
    doc, log = collect_status(
        settings.db,
        settings.topic,
        settings.bootstrap_servers,
        latest=max(0, args.quarantine),
        kafka_config=settings.kafka_config(),
    )
    print(json.dumps(doc, indent=2) if args.json else render_status(doc))
    if settings.bootstrap_servers and log.error is not None:
        raise log.error  # with its own code and exit code (2 for settings that do not fit the cluster)
    return 0


def _cmd_quarantine(args: argparse.Namespace) -> int:
    from throughline.core.identity import project_sha256
    from throughline.projector.quarantine_report import collect_quarantine, render_quarantine

    settings = settings_from(args)
    project_hash = None if args.project is None else project_sha256(args.project)
    doc = collect_quarantine(settings.db, settings.topic, project_hash)
    print(json.dumps(doc, indent=2) if args.json else render_quarantine(doc))
    return 0


def _cmd_repair(args: argparse.Namespace) -> int:
    from throughline.core.repair import build_repair, parse_source_hash
    from throughline.producers.producer import PRODUCER_VERSION, TurnProducer
    from throughline.projector.repair import dry_run_document, repair_json

    settings = settings_from(args)
    if args.source is not None and (args.host is not None or args.thread is not None):
        from throughline.core.exceptions import RepairArgumentsError

        raise RepairArgumentsError("name the source by --host and --thread, or by --source, not both")
    repair = build_repair(
        project=args.project,
        host=args.host,
        thread=args.thread,
        source=None if args.source is None else parse_source_hash(args.source),
        reason=args.reason,
        producer_name=REPAIR_PRODUCER_NAME,
        producer_version=PRODUCER_VERSION,
        produced_at_micros=time.time_ns() // 1000,
    )
    if args.dry_run:
        print(json.dumps(dry_run_document(settings.db, settings.topic, repair), indent=2))
        return 0
    servers = settings.require_bootstrap()
    # ensure=False: a repair never creates the topic (there is nothing to repair in a new one).
    with TurnProducer(
        servers, settings.topic, ensure=False, producer_name=REPAIR_PRODUCER_NAME, kafka_config=settings.kafka_config()
    ) as producer:
        position = producer.send_repair(repair)
    print(
        json.dumps(
            {
                "topic": settings.topic,
                "repair": repair_json(repair),
                "appended": {"partition": position.partition, "offset": position.offset},
            },
            indent=2,
        )
    )
    print(
        f"repair appended at p{position.partition}@{position.offset}; it takes effect when the projector applies "
        "that offset (see `throughline quarantine`)",
        file=sys.stderr,
    )
    return 0


#: The producer name a repair record carries (``producer.name``).
REPAIR_PRODUCER_NAME = "throughline-repair"
