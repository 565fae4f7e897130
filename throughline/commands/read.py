"""``throughline read`` and ``throughline observe`` (docs/spec.md#command-line).

``read`` prints exactly one ``throughline.observer_read.v1`` document on stdout and exits 0 whatever
its status (``projection_pending`` and ``resync_required`` are answers). A hard input error exits 2 with
``{"error": {"code", "message"}}`` on stderr (printed by ``throughline.cli``).

``observe`` runs the reference Observer: one series (or, with ``--follow``, series until SIGINT or
SIGTERM), auditing each turn with ``--exec CMD`` (run through the shell with the turn's wire JSON on
stdin; a non-zero exit fails the audit: exit 1, code ``audit_failed``) or, without ``--exec``, by
printing each turn as one JSON line on stdout. A summary for a person goes to stderr.

Both read the DuckDB projection (``--db``) read-only, opened afresh for every page so that a projector
can take the file between pages, and the Kafka log's end offsets (``--bootstrap-servers``)
(``throughline.reader.local``), or a running ``serve`` with ``--url``.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

from throughline.commands.options import add_connection_options, add_http_options, http_reader_from_args, settings_from
from throughline.core.exceptions import InvalidLimitError, InvalidProjectError
from throughline.core.page_range import DEFAULT_LIMIT, MAX_LIMIT, MIN_LIMIT, validate_limit
from throughline.reader.exceptions import AuditFailedError, InvalidBodyLimitError
from throughline.reader.local import open_page_reader
from throughline.reader.observer import Observer
from throughline.reader.page import DEFAULT_BODY_LIMIT, DEFAULT_WAIT_TIMEOUT
from throughline.reader.request import ReadRequest, require_seconds
from throughline.reader.token_key import ENV_TOKEN_KEY, ENV_TOKEN_KEY_FILE
from throughline.reader.wire import TurnRecordWire

_INTEGER = re.compile(r"[+-]?[0-9]{1,18}")


def register(subparsers: Any) -> None:
    """Add the ``read`` and ``observe`` subcommands."""
    read = subparsers.add_parser(
        "read",
        help="read one page of a pinned series of completed turns",
        description="Print one throughline.observer_read.v1 JSON document on stdout.",
    )
    read.add_argument("--project", required=True, help="the project (canonicalised and hashed)")
    read.add_argument("--after", default=None, metavar="CURSOR", help="after cursor (omit on first contact)")
    read.add_argument("--through", default=None, metavar="CURSOR", help="through cursor of the series (later pages)")
    read.add_argument("--page-token", default=None, metavar="TOKEN", help="page.nextToken of the previous page")
    read.add_argument(
        "--limit",
        default=None,
        metavar="N",
        help=f"turns per page, {MIN_LIMIT}..{MAX_LIMIT} (default {DEFAULT_LIMIT})",
    )
    _add_reader_options(read)
    read.set_defaults(func=_cmd_read)

    observe = subparsers.add_parser(
        "observe",
        help="the reference Observer: audit series of turns, save the cursor only after a whole series",
        description=(
            "Read series of completed turns page by page, audit each turn, and save the through cursor "
            "to --state only after the whole series was audited."
        ),
    )
    observe.add_argument("--project", required=True, help="the project (canonicalised and hashed)")
    observe.add_argument("--state", required=True, metavar="FILE", help="state file holding the after cursor")
    observe.add_argument(
        "--exec",
        dest="exec_cmd",
        default=None,
        metavar="CMD",
        help="audit command run through the shell per turn, turn JSON on stdin; non-zero exit fails the audit",
    )
    observe.add_argument("--limit", default=None, metavar="N", help=f"turns per page, {MIN_LIMIT}..{MAX_LIMIT}")
    observe.add_argument(
        "--on-resync",
        choices=("snapshot", "fail"),
        default="snapshot",
        help="on resync_required: read a fresh snapshot (default) or fail with exit 1",
    )
    observe.add_argument("--follow", action="store_true", help="keep running series until SIGINT/SIGTERM")
    observe.add_argument("--interval", default="1.0", metavar="SECONDS", help="pause between series with --follow")
    observe.add_argument(
        "--max-pending-wait",
        default="60",
        metavar="SECONDS",
        help="give up (exit 1, code projection_pending) after the projection stayed pending this long",
    )
    _add_reader_options(observe)
    observe.set_defaults(func=_cmd_observe)


def _add_reader_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait",
        default=str(DEFAULT_WAIT_TIMEOUT),
        metavar="SECONDS",
        help=f"bounded wait for the projector per read (default {DEFAULT_WAIT_TIMEOUT})",
    )
    parser.add_argument(
        "--body-limit",
        default=str(DEFAULT_BODY_LIMIT),
        metavar="BYTES",
        help=f"cut bodies to this many UTF-8 bytes (default {DEFAULT_BODY_LIMIT})",
    )
    parser.add_argument(
        "--token-key-file",
        default=None,
        metavar="FILE",
        help=f"page-token key file (env {ENV_TOKEN_KEY_FILE}; {ENV_TOKEN_KEY} wins; default beside --db)",
    )
    add_connection_options(parser)
    add_http_options(parser)


# ------------------------------------------------------------------------------------------- parsing


def parse_limit(text: str | None) -> int:
    """``--limit``: an integer 1..100 (default 10); anything else is ``invalid_limit``."""
    if text is None:
        return DEFAULT_LIMIT
    if not _INTEGER.fullmatch(text.strip()):
        raise InvalidLimitError(f"limit must be an integer from {MIN_LIMIT} to {MAX_LIMIT}, got {text!r}")
    return validate_limit(int(text))


def _parse_body_limit(text: str) -> int:
    if not _INTEGER.fullmatch(text.strip()) or int(text) < 0:
        raise InvalidBodyLimitError(f"--body-limit must be an integer >= 0, got {text!r}")
    return int(text)


def _parse_seconds(text: str, flag: str) -> float:
    return require_seconds(text, flag, text=True)


# ------------------------------------------------------------------------------------------- commands


def _cmd_read(args: argparse.Namespace) -> int:
    request = ReadRequest(
        project=args.project,
        after_cursor=args.after,
        through_cursor=args.through,
        page_token=args.page_token,
        limit=parse_limit(args.limit),
    )
    body_limit = _parse_body_limit(args.body_limit)
    wait = _parse_seconds(args.wait, "--wait")
    with http_reader_from_args(args) or open_page_reader(
        settings_from(args), token_key_file=args.token_key_file, wait_timeout=wait, body_limit=body_limit
    ) as reader:
        read = reader.read(request)
    sys.stdout.write(read.to_json() + "\n")
    sys.stdout.flush()
    return 0


def exec_audit(command: str) -> Callable[[TurnRecordWire], None]:
    """An audit step running ``command`` through the shell with the turn's wire JSON on stdin."""

    def audit(turn: TurnRecordWire) -> None:
        try:
            done = subprocess.run(command, shell=True, input=turn.model_dump_json().encode(), check=False)
        except OSError as exc:
            raise AuditFailedError(f"cannot run the audit command: {exc.strerror or exc}") from None
        if done.returncode != 0:
            raise AuditFailedError(
                f"the audit command failed on seq {turn.seq} (exit {done.returncode}); cursor unchanged"
            )

    return audit


def _print_audit(turn: TurnRecordWire) -> None:
    sys.stdout.write(turn.model_dump_json() + "\n")
    sys.stdout.flush()


def _cmd_observe(args: argparse.Namespace) -> int:
    limit = parse_limit(args.limit)
    body_limit = _parse_body_limit(args.body_limit)
    wait = _parse_seconds(args.wait, "--wait")
    interval = _parse_seconds(args.interval, "--interval")
    max_pending_wait = _parse_seconds(args.max_pending_wait, "--max-pending-wait")
    if not args.project:
        raise InvalidProjectError("--project must not be empty")
    stop = threading.Event()

    def notify(message: str) -> None:
        print(f"throughline observe: {message}", file=sys.stderr, flush=True)

    with http_reader_from_args(args) or open_page_reader(
        settings_from(args), token_key_file=args.token_key_file, wait_timeout=wait, body_limit=body_limit
    ) as reader:
        observer = Observer(
            reader,
            project=args.project,
            state_path=args.state,
            audit=exec_audit(args.exec_cmd) if args.exec_cmd else _print_audit,
            limit=limit,
            on_resync=args.on_resync,
            max_pending_wait=max_pending_wait,
            notify=notify,
            should_stop=stop.is_set,
        )
        if not args.follow:
            notify(observer.run_series().describe())
            return 0

        def on_signal(*_: object) -> None:
            stop.set()
            observer.interrupt_read()  # a long-poll in progress ends now, not when the server answers

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            summaries = observer.run_forever(interval=interval)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        notify(f"stopped after {len(summaries)} series")
    return 0
