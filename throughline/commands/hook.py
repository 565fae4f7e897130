"""``throughline hook claude-code`` / ``throughline hook codex``: a host's ``Stop`` hook.

The host runs the command when a turn ends and writes the hook's JSON on stdin (``session_id``,
``transcript_path``, ``cwd``, ``hook_event_name``, ...). Codex's older ``notify`` program gets its JSON
as the last argument instead (``{"type": "agent-turn-complete", "thread-id", ...}``, no transcript
path: the rollout is found by its thread id under ``$CODEX_HOME/sessions``); both are accepted.

The hook appends the completed turns of that transcript that its state file does not yet cover, with
the same parser and resume state as ``ingest --format`` (one state file per transcript under
``--state-dir``). When the transcript's last turn is not complete yet (the host may not have flushed
its final line), it re-reads the file for up to ``--wait`` seconds, then settles the file: the call
itself says the host has finished the turn (docs/hosts.md, "Settling").

It must never stall or steer the host:

- every wait is bounded, and a watchdog ends the process ``--timeout`` seconds after it started,
  whatever it is doing (a turn not acknowledged by then is simply not covered by the state);
- it writes nothing on stdout (both hosts read a JSON decision there) and never exits with 2 (Claude
  Code and Codex both take exit code 2 from a Stop hook as "keep going" and feed stderr to the model);
- exit 0: every completed turn of the transcript is in the log (or there was none); exit 1: something
  was left for later (broker unreachable, no transcript, a bad payload), said on stderr as
  ``{"error": {...}}``. Both hosts show a non-blocking error for 1 and carry on. The transcript is the
  spool: the next hook call (or an ``ingest --format ... --follow``) sends what was left.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import threading
import time
from typing import Any

from throughline.cli import emit_error
from throughline.commands.options import add_connection_options, seconds_argument, settings_from
from throughline.errors import ThroughlineError
from throughline.producers.exceptions import HookError, HookFailedError, HookTimeoutError
from throughline.producers.hook import (
    default_state_dir,
    hook_hosts,
    read_payload,
    transcript_of,
    wait_for_last_turn,
)
from throughline.producers.ingest.run import Ingest
from throughline.producers.ingest.sessions import SessionDecoder, SessionFiles, SessionsState
from throughline.producers.ingest.state import load_session_states
from throughline.producers.producer import PRODUCER_VERSION, TurnProducer

HOOK_PRODUCER_NAME = "throughline-hook"
DEFAULT_TIMEOUT = 5.0
DEFAULT_WAIT = 1.0
_EXIT_LEFT_FOR_LATER = 1


def hook_argv(argv: list[str]) -> list[str]:
    """``argv`` with a trailing JSON payload moved next to the host name.

    Codex's ``notify`` appends its JSON after whatever the configuration lists, options included
    (``["throughline", "hook", "codex", "--timeout", "3"]``); argparse takes positionals only before them.
    """
    if len(argv) > 3 and argv[-1].lstrip().startswith("{") and not argv[-2].startswith("--"):
        return [*argv[:2], argv[-1], *argv[2:-1]]
    return argv


def register(subparsers: Any) -> None:
    """Add the ``hook`` subcommand."""
    p = subparsers.add_parser(
        "hook",
        help="a host's Stop hook: append the transcript's new completed turns (never blocks the host)",
        description="Read a host's hook JSON (stdin, or the last argument for Codex notify) and append "
        "the completed turns of its transcript not yet appended. Exit 0 or 1, never 2.",
    )
    p.add_argument("host", choices=hook_hosts(), help="the host calling the hook")
    p.add_argument("payload", nargs="?", default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--timeout",
        type=seconds_argument,
        default=DEFAULT_TIMEOUT,
        help=f"seconds before the hook gives up (default {DEFAULT_TIMEOUT:g})",
    )
    p.add_argument(
        "--wait",
        type=seconds_argument,
        default=DEFAULT_WAIT,
        help=f"seconds to wait for the last turn's final line (default {DEFAULT_WAIT:g})",
    )
    p.add_argument(
        "--state-dir",
        default=None,
        help="where the per-transcript states are kept (default $XDG_STATE_HOME/throughline/hooks)",
    )
    add_connection_options(p)
    p.set_defaults(func=run_hook)


def _watchdog(seconds: float) -> threading.Timer:
    def fire() -> None:
        try:
            emit_error(HookTimeoutError(f"the hook ran out of its {seconds:g}s; the rest is sent later"))
            sys.stderr.flush()
        finally:
            os._exit(_EXIT_LEFT_FOR_LATER)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    return timer


def run_hook(args: argparse.Namespace) -> int:
    """Run ``throughline hook HOST``: 0 when the transcript's completed turns are in the log, else 1."""
    started = time.monotonic()
    timeout = max(1.0, float(args.timeout))
    timer = _watchdog(timeout)
    try:
        return _run(args, started, timeout)
    except ThroughlineError as exc:
        emit_error(exc)
        return _EXIT_LEFT_FOR_LATER
    except Exception as exc:  # a hook must not crash the host's turn with a traceback and an odd exit code
        emit_error(HookFailedError(f"{type(exc).__name__}: {exc}"))
        return _EXIT_LEFT_FOR_LATER
    finally:
        timer.cancel()


def _run(args: argparse.Namespace, started: float, timeout: float) -> int:
    format = args.host
    payload = read_payload(args.payload, sys.stdin)
    path = transcript_of(format, payload)
    if not os.path.isfile(path):
        raise HookError(f"{path}: no such transcript")
    wait_for_last_turn(format, path, min(float(args.wait), timeout / 3))
    settings = settings_from(args)
    servers = settings.require_bootstrap()
    state_dir = args.state_dir or default_state_dir()
    state_path = os.path.join(state_dir, f"{format}-{hashlib.sha256(path.encode()).hexdigest()[:32]}.json")
    saved = load_session_states(state_path, format=format)

    def notice(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    # The host calls its Stop hook after the turn is written: the transcript is final for now (settle 0).
    files = SessionFiles(format, [path], follow=False, states=saved, notice=notice, settle=0.0, final=True)
    remaining = timeout - (time.monotonic() - started)
    with TurnProducer(
        servers,
        settings.topic,
        connect_timeout=max(1.0, min(3.0, remaining / 2)),
        send_timeout=max(1.0, remaining / 2),
        producer_name=HOOK_PRODUCER_NAME,
        kafka_config=settings.kafka_config(),
    ) as producer:
        decoder = SessionDecoder(
            files, warn=notice, producer_name=HOOK_PRODUCER_NAME, producer_version=PRODUCER_VERSION
        )
        ingest = Ingest(
            files,
            producer,
            state_path=state_path,
            state=SessionsState(state_path, files, saved),
            decoder=decoder,
            err=sys.stderr,
        )
        stats = ingest.run()
    if stats.turns_sent:
        notice(f"throughline: {stats.turns_sent} turns of {path} appended")
    return 0
