"""``throughline ingest [--format {jsonl,claude-code,codex}] PATH... [--follow] [--state STATE] [--settle S] [--dry-run]``.

``--format jsonl`` (the default) takes one FILE (``-`` = stdin) of JSON Lines; the host formats take
session files or folders searched for them, the host's default root when no PATH is given (see
``throughline.producers.ingest.sessions`` and docs/hosts.md).

Appends completed turns from JSON Lines (see the ``throughline.producers.ingest`` package). On stderr: one
``line N: CODE: message`` per rejected line, progress every 2 s (only when stderr is a terminal, or
with ``--progress``; ``--no-progress`` silences it), and at the end the summary
``ingested N turns from FILE, M lines rejected``.

Exit codes: 0 when every line landed (or was blank); 2 when any line was rejected (the last stderr line
is then ``{"error": {"code": "lines_rejected", ...}}``); 1 when the broker failed (the state, if any,
records exactly what was acknowledged); 130 when a non-following ingest was interrupted. A following
ingest stopped by SIGINT/SIGTERM flushes, saves its state and exits as if its input had ended (0, or 2
when lines were rejected).

State: ``--follow`` keeps a state file (``FILE.ingest-state`` unless ``--state`` says otherwise) and
resumes from it; without ``--follow`` a state file is used only when ``--state`` is given. Standard
input has no state.

``--settle SECONDS`` (host formats; default 120): a session file that has not grown for that long is
final, and its parser's open turn is completed when it has its reply (``SessionFiles``).

``--dry-run`` prints the turns the same command would append, one ``jsonl`` ingest line each, on
stdout (``throughline.producers.ingest.dry``), and contacts no broker: no bootstrap server is needed,
``--state`` is read (a dry run shows what a resumed run would send) and never written, and
``--follow`` is refused. Exit codes are ingest's (2 for a missing PATH or a rejected line).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from throughline.cli import emit_error
from throughline.commands.options import (
    add_connection_options,
    add_replication_options,
    count_argument,
    replication_overrides,
    seconds_argument,
    settings_from,
)
from throughline.errors import Interrupted, InvalidArgumentsError, ThroughlineError
from throughline.log import DEFAULT_PARTITIONS
from throughline.producers.exceptions import LinesRejectedError, StateNeedsFileError
from throughline.producers.hosts.files import FORMATS, default_roots
from throughline.producers.hosts.sources import session_source
from throughline.producers.ingest import (
    POLL_INTERVAL,
    Ingest,
    IngestStats,
    LineReader,
    default_ingest_state_path,
    load_ingest_state,
    stop_on_signals,
)
from throughline.producers.ingest.dry import PrintSender
from throughline.producers.ingest.run import Sender
from throughline.producers.ingest.sessions import (
    SESSION_POLL_INTERVAL,
    SessionDecoder,
    SessionsState,
)
from throughline.producers.ingest.state import load_session_states
from throughline.producers.producer import PRODUCER_VERSION, TurnProducer
from throughline.settings import Settings

INGEST_PRODUCER_NAME = "throughline-ingest"
#: ``--settle``'s default: a session file idle this long is taken as final (see docs/hosts.md).
DEFAULT_SETTLE_SECONDS = 120.0


def register(subparsers: Any) -> None:
    """Add the ``ingest`` subcommand."""
    p = subparsers.add_parser(
        "ingest",
        help="append completed turns from JSON Lines or a host's transcripts to the log",
        description="Append completed turns to the topic: from JSON Lines (one turn a line), or from "
        "Claude Code or Codex session files (a file, or a folder searched for them; the host's default "
        "root without PATH).",
    )
    p.add_argument(
        "paths",
        metavar="PATH",
        nargs="*",
        help="jsonl: one FILE, or - for standard input; claude-code/codex: session files or folders",
    )
    p.add_argument(
        "--format",
        choices=("jsonl", *FORMATS),
        default="jsonl",
        help="jsonl (default): throughline's JSON Lines; a host's name: that host's own transcripts (docs/hosts.md)",
    )
    p.add_argument("--follow", action="store_true", help="keep reading as files grow (like tail -F) and find new ones")
    p.add_argument(
        "--state",
        default=None,
        help="resume state file (default with --follow: FILE.ingest-state for jsonl, "
        "$XDG_STATE_HOME/throughline/ingest-FORMAT-*.json for a host format)",
    )
    p.add_argument(
        "--partitions",
        metavar="N",
        type=count_argument(1),
        default=DEFAULT_PARTITIONS,
        help=f"partitions when the topic is created (default {DEFAULT_PARTITIONS}; an existing topic keeps its own)",
    )
    add_replication_options(p)
    p.add_argument(
        "--allow-lossy-topic",
        action="store_true",
        help="accept an existing topic with finite retention, compaction or too little replication "
        "(records may be lost)",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress on stderr every 2 s (default: only when stderr is a terminal)",
    )
    p.add_argument(
        "--settle",
        metavar="SECONDS",
        type=seconds_argument,
        default=None,
        help=f"host formats: a session file that has not grown for SECONDS is final and its last open turn "
        f"that has a reply is sent (default {DEFAULT_SETTLE_SECONDS:g}; 0 settles every file: importing a "
        "finished history)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the turns that would be appended (one jsonl ingest line each) instead of sending them; "
        "no broker is contacted and --state is only read",
    )
    p.add_argument("--send-timeout", type=seconds_argument, default=30.0, help="seconds to wait for an acknowledgement")
    p.add_argument(
        "--connect-timeout", type=seconds_argument, default=15.0, help="seconds to wait for the broker at start"
    )
    # For tests and scripts: stop following after this much time without new input.
    p.add_argument("--max-idle", type=seconds_argument, default=None, help=argparse.SUPPRESS)
    p.add_argument("--poll-interval", type=seconds_argument, default=None, help=argparse.SUPPRESS)
    add_connection_options(p)
    p.set_defaults(func=run_ingest)


def _ingest_producer(args: argparse.Namespace, settings: Settings) -> TurnProducer:
    """The producer ``ingest`` sends with, from its flags (one for a file or stdin, one for host sessions)."""
    replication_factor, min_insync_replicas = replication_overrides(args)
    return TurnProducer(
        settings.require_bootstrap(),
        settings.topic,
        partitions=args.partitions,
        allow_lossy=args.allow_lossy_topic,
        replication_factor=replication_factor,
        min_insync_replicas=min_insync_replicas,
        send_timeout=max(1.0, args.send_timeout),
        connect_timeout=max(1.0, args.connect_timeout),
        producer_name=INGEST_PRODUCER_NAME,
        kafka_config=settings.kafka_config(),
    )


def _sender(args: argparse.Namespace, settings: Settings) -> contextlib.AbstractContextManager[Sender]:
    """Where turns go: the broker, or stdout for ``--dry-run``."""
    if args.dry_run:
        return contextlib.nullcontext(PrintSender(sys.stdout.buffer))
    return _ingest_producer(args, settings)


def _check_flags(args: argparse.Namespace, settings: Settings) -> None:
    """Refuse flags that do not go together, and a run that would send with no broker named, before any
    input is opened."""
    if args.dry_run and args.follow:
        raise InvalidArgumentsError("--dry-run reads what is there once; it does not take --follow")
    if args.format == "jsonl" and args.settle is not None:
        raise InvalidArgumentsError("--settle is for the host formats (--format HOST)")
    if not args.dry_run:
        settings.require_bootstrap()
    replication_overrides(args)  # contradictory replication flags are refused before any input is opened too


def _state_path(args: argparse.Namespace) -> str | None:
    if args.file == "-":
        if args.state:
            raise StateNeedsFileError("standard input has no resume state; --state needs a FILE")
        return None
    if args.state:
        return str(args.state)
    return default_ingest_state_path(args.file) if args.follow else None


def default_sessions_state_path(format: str, roots: list[str]) -> str:
    """Where a following host-format ingest keeps its state when ``--state`` is not given."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    key = hashlib.sha256("\0".join(sorted(os.path.abspath(r) for r in roots)).encode()).hexdigest()[:16]
    return os.path.join(base, "throughline", f"ingest-{format}-{key}.json")


def run_ingest(args: argparse.Namespace) -> int:
    """Run ``throughline ingest``; returns the exit code."""
    if args.format != "jsonl":
        return run_sessions_ingest(args)
    if len(args.paths) != 1:
        raise InvalidArgumentsError("--format jsonl takes exactly one FILE (or - for standard input)")
    args.file = args.paths[0]
    if args.poll_interval is None:
        args.poll_interval = POLL_INTERVAL
    settings = settings_from(args)
    _check_flags(args, settings)
    state_path = _state_path(args)
    start = load_ingest_state(state_path) if state_path else None
    if args.dry_run:
        state_path = None  # read, never written

    # Open the input before connecting: a missing file is the caller's mistake, not the broker's.
    reader = LineReader(
        args.file,
        follow=args.follow,
        start=start,
        poll_interval=max(0.01, args.poll_interval),
        notice=_notice,
    )
    stop = threading.Event()
    label = "stdin" if args.file == "-" else args.file

    verb = "would ingest" if args.dry_run else "ingested"

    def sent(s: IngestStats) -> str:
        return f"{verb} {s.turns_sent} turns from {label}, {s.rejected} lines rejected"

    ingest: Ingest | None = None
    try:
        with _sender(args, settings) as producer, stop_on_signals(stop, reader) as signals:
            ingest = Ingest(
                reader,
                producer,
                state_path=state_path,
                stop=stop,
                max_idle=args.max_idle,
                progress=_progress(args),
                err=sys.stderr,
                producer_name=INGEST_PRODUCER_NAME,
                producer_version=PRODUCER_VERSION,
            )
            stats = ingest.run()
    except ThroughlineError:
        _stopped_by_error(ingest, sent)
        raise
    finally:
        reader.close()
    _notice(sent(stats))
    why = f"{stats.rejected} of {stats.lines_read} lines rejected (see the lines above)"
    return _exit_code(args, bool(signals.signals), stats, why)


def run_sessions_ingest(args: argparse.Namespace) -> int:
    """Run ``throughline ingest --format HOST``; returns the exit code."""
    settings = settings_from(args)
    _check_flags(args, settings)
    roots = list(args.paths) or default_roots(args.format)
    state_path = args.state or (default_sessions_state_path(args.format, roots) if args.follow else None)
    saved = load_session_states(state_path, format=args.format) if state_path else {}
    if args.dry_run:
        state_path = None  # read, never written

    if state_path and not args.state:
        _notice(f"resume state: {state_path}")
    poll = SESSION_POLL_INTERVAL if args.poll_interval is None else args.poll_interval
    settle = DEFAULT_SETTLE_SECONDS if args.settle is None else args.settle
    files = session_source(
        args.format,
        roots,
        follow=args.follow,
        states=saved,
        poll_interval=max(0.01, poll),
        notice=_notice,
        settle=settle,
    )
    decoder = SessionDecoder(files, warn=_notice, producer_name=INGEST_PRODUCER_NAME, producer_version=PRODUCER_VERSION)
    stop = threading.Event()
    label = " ".join(roots)
    ingest: Ingest | None = None
    try:
        with _sender(args, settings) as producer, stop_on_signals(stop) as signals:
            ingest = Ingest(
                files,
                producer,
                state_path=state_path,
                state=SessionsState(state_path, files, saved) if state_path else None,
                stop=stop,
                max_idle=args.max_idle,
                progress=_progress(args),
                err=sys.stderr,
                decoder=decoder,
            )
            files.covered = ingest.covered_line
            stats = ingest.run()
    except ThroughlineError:
        _stopped_by_error(ingest, lambda s: f"ingested {s.turns_sent} turns from {label}")
        raise
    finally:
        files.close()
    _notice(
        f"{'would ingest' if args.dry_run else 'ingested'} {stats.turns_sent} turns from {len(files.tracked)} {args.format} session files under {label}, "
        f"{decoder.skipped} lines skipped"
    )
    return _exit_code(
        args, bool(signals.signals), stats, f"{stats.rejected} turns refused by the broker (see the lines above)"
    )


def _notice(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _progress(args: argparse.Namespace) -> bool:
    """``--progress``/``--no-progress``, else a progress line only on a terminal."""
    return bool(args.progress) if args.progress is not None else sys.stderr.isatty()


def _stopped_by_error(ingest: Ingest | None, sent: Callable[[IngestStats], str]) -> None:
    # Say what was sent before the error: the operator sees how far the run got.
    if ingest is not None:
        _notice(f"{sent(ingest.stats)} (stopped by an error)")


def _exit_code(args: argparse.Namespace, interrupted: bool, stats: IngestStats, rejected: str) -> int:
    """0 for a complete run, 130 for a signal before the end of a finite input, else ``lines_rejected``'s
    exit code when something was rejected (``rejected`` says what)."""
    if interrupted and not args.follow:
        emit_error(Interrupted("interrupted before the end of the input"))
        return 130
    if stats.rejected:
        emit_error(LinesRejectedError(rejected))
        return LinesRejectedError.exit_code
    return 0
