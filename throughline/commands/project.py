"""``throughline project`` and ``throughline replay`` (docs/spec.md#command-line).

- ``throughline project [--until-caught-up]``: run the projector on ``--db``; with the flag, exit once
  every partition's applied offset reaches the end offset seen at start. Prints a JSON summary on
  stdout when it stops (SIGTERM/SIGINT stop it after the batch in flight is committed).
- ``throughline replay --db NEW_FILE``: rebuild the projection from offset 0 into a new file, with a
  progress bar on stderr (``ProgressBar``) and a JSON summary on stdout (records, turns, duplicates,
  quarantined, rate).

Errors are raised as typed ``ThroughlineError``s; ``throughline.cli`` prints them as JSON on stderr and
exits 2 for input/configuration errors, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from throughline.commands.options import add_sync_commits, command, settings_from
from throughline.runtime import StopOnSignals

if TYPE_CHECKING:  # the projector (and DuckDB) loads only when a command runs
    from throughline.projector.runner import ProgressUpdate

T = TypeVar("T")


def register(subparsers: Any) -> None:
    """Add ``project`` and ``replay`` to the ``throughline`` parser."""
    project = command(
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

    replay = command(
        subparsers,
        "replay",
        _cmd_replay,
        help="rebuild a projection from offset 0 into a new file",
        description="Replay the topic from offset 0 into a NEW DuckDB file (refuses an existing, non-empty file).",
    )
    replay.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    _add_tuning(replay)


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
    from throughline.projector.replay import replay

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


class ProgressBar:
    """A progress bar on a stream (stderr): redrawn in place on a terminal, a line every few seconds otherwise."""

    def __init__(self, stream: TextIO | None = None, *, width: int = 30, line_interval: float = 5.0) -> None:
        self._stream = stream or sys.stderr
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._width = width
        self._interval = 0.1 if self._tty else line_interval
        self._last = 0.0
        self._drawn = False

    def __call__(self, update: ProgressUpdate) -> None:
        now = time.monotonic()
        if now - self._last < self._interval:
            return
        self._last = now
        self._draw(update)

    def _draw(self, update: ProgressUpdate) -> None:
        targets = update.targets or {}
        total = sum(max(0, end - update.started_at.get(p, 0)) for p, end in targets.items())
        done = sum(
            max(0, min(update.applied.get(p, 0), end) - update.started_at.get(p, 0)) for p, end in targets.items()
        )
        fraction = done / total if total else 1.0
        filled = int(round(fraction * self._width))
        rate = update.summary.records / update.elapsed if update.elapsed > 0 else 0.0
        text = (
            f"[{'#' * filled}{'.' * (self._width - filled)}] {fraction * 100:5.1f}% "
            f"{done}/{total} offsets, {update.summary.appended} turns, {update.summary.quarantined} quarantined, "
            f"{rate:,.0f} records/s"
        )
        if self._tty:
            self._stream.write("\r" + text)
            self._drawn = True
        else:
            self._stream.write(text + "\n")
        self._stream.flush()

    def finish(self, update: ProgressUpdate | None = None) -> None:
        """Draw the final state (when known) and end the line."""
        if update is not None:
            self._draw(update)
        if self._tty and self._drawn:
            self._stream.write("\n")
            self._stream.flush()
