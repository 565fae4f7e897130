"""A rebuild's replay in a child process of its own, at a lower CPU priority (``serve``'s rebuild without
downtime, ``throughline.serve.rebuild``).

The replay folds the whole topic into the new file while ``serve`` answers reads from the live one. In
``serve``'s process it competed with the reads for the GIL (the fold is Python) and the cores: on two
cores, reads' p99 went from ~17 ms to 50-90 ms for the 2-3 s the replay of a small topic lasted, spread
over the whole replay, while the switch itself paused for 3-60 ms (docs/benchmarks.md, "9. Reads during a
rebuild's switch"). In a child process it shares no GIL with them, and at ``REPLAY_NICENESS`` the kernel
runs ``serve`` first whenever both want a core; on an idle machine it runs as fast as before.

The child is ``python -m throughline.projector.rebuild_replay``. It reads its spec (a pickled dict of
builtins and a ``KafkaClientConfig``) from stdin, folds the topic into the file with the projector
(``Projector.run``, from the file's applied offsets) and writes one JSON line to stdout at most every
``REPORT_EVERY`` seconds: ``{"applied": {partition: offset}}``; then, when it stopped, ``{"applied": ...,
"done": true}`` once the file is committed and closed, or ``{"error": "..."}``. A new file's turn keys are
kept in memory as it commits, and written to ``turn_keys_of(path)`` before the file closes, for ``serve``
to adopt rather than scan (``projector.store.stored_keys``). It stops when its stdin
reaches its end (the parent closed it, or died), and dies with its parent (``PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from throughline.projector.exceptions import ReplayProcessError

#: The module the child runs with ``python -m``.
REPLAY_MODULE = "throughline.projector.rebuild_replay"
#: How much lower the child's CPU priority is than ``serve``'s (``nice``: 19 is the lowest).
REPLAY_NICENESS = 10
#: Seconds between the child's progress lines.
REPORT_EVERY = 0.05
#: The child's poll timeout (seconds): how long it may take to notice its stop between polls.
REPLAY_POLL_TIMEOUT = 0.05
#: Bound on the child's exit once it said it is done (seconds).
REAP_TIMEOUT = 30.0


class ReplayProcess:
    """One replay of ``topic`` into ``path`` in a child process (``start``), followed through its progress
    lines (``offsets``), stopped by ``stop`` (it commits its batch in flight and closes the file).

    Threading: ``start``, ``stop`` and ``raise_failure`` from the thread that owns the rebuild; ``offsets``
    from any thread. The child's last report (offsets, its end, its error) is this object's, changed by
    its reader thread under its lock.
    """

    def __init__(
        self,
        path: Path,
        servers: Sequence[str],
        topic: str,
        *,
        kafka_config: Any = None,
        sync_commits: bool = False,
        niceness: int = REPLAY_NICENESS,
    ) -> None:
        self._spec = {
            "path": str(path),
            "servers": list(servers),
            "topic": topic,
            "kafka_config": kafka_config,
            "sync_commits": sync_commits,
            # An absolute nice value, set by the parent as soon as the child exists (its interpreter's start
            # and first imports, ~60 ms of a core, at the lower priority too) and again by the child.
            "nice": min(19, os.getpriority(os.PRIO_PROCESS, 0) + niceness),
            "parent": os.getpid(),
        }
        self._lock = threading.Lock()
        self._applied: dict[int, int] = {}
        self._done = False
        self._error: str | None = None
        self._last = threading.Event()  # its last line came (done or an error), or its stdout ended
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        """Start the child and hand it its spec."""
        proc = subprocess.Popen(
            [sys.executable, "-m", REPLAY_MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        self._proc = proc
        with contextlib.suppress(OSError):  # gone already: its failure is reported as any other
            os.setpriority(os.PRIO_PROCESS, proc.pid, int(self._spec["nice"]))
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(pickle.dumps(self._spec, protocol=pickle.HIGHEST_PROTOCOL))
        proc.stdin.flush()  # kept open: its end is the child's stop
        self._reader = threading.Thread(
            target=self._read, args=(proc.stdout,), name="throughline-rebuild-replay", daemon=True
        )
        self._reader.start()

    def _read(self, stdout: IO[bytes]) -> None:
        try:
            for raw in stdout:
                try:
                    line = json.loads(raw)
                except ValueError:
                    continue  # not a report (a library printing to stdout): the child's stderr is serve's
                with self._lock:
                    if "applied" in line:
                        self._applied = {int(p): int(o) for p, o in line["applied"].items()}
                    self._done = self._done or bool(line.get("done"))
                    self._error = line.get("error", self._error)
                    if self._done or self._error is not None:
                        self._last.set()
        finally:
            self._last.set()

    def offsets(self) -> dict[int, int]:
        """The file's applied offsets, as the child last reported them."""
        with self._lock:
            return dict(self._applied)

    def raise_failure(self) -> None:
        """Raise ``ReplayProcessError`` if the child failed, or ended before it was done."""
        if not self._last.is_set() and (self._proc is None or self._proc.poll() is None):
            return  # still running (or never started)
        self._last.wait(5.0)  # its last lines, once it exited
        with self._lock:
            error, done = self._error, self._done
        if error is not None:
            raise ReplayProcessError(f"the rebuild's replay failed: {error}")
        if not done:
            raise ReplayProcessError("the rebuild's replay process ended before it was done")

    def stop(self, timeout: float) -> None:
        """Ask the child to stop and wait, at most ``timeout`` seconds, until it says it is done (its batch in
        flight committed, the file closed: another process may open it) or failed; past that it is killed
        (the file holds what it committed). Its exit goes on beside what follows."""
        proc, self._proc = self._proc, None  # stopped once: a second stop has nothing to do
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        if not self._last.wait(timeout):
            proc.kill()
            proc.wait(10.0)
            raise ReplayProcessError(f"the rebuild's replay did not stop within {timeout:g}s; killed")
        threading.Thread(target=self._reap, args=(proc,), name="throughline-replay-exit", daemon=True).start()

    def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            proc.wait(REAP_TIMEOUT)
        except subprocess.TimeoutExpired:  # done, yet stuck in its exit: it holds nothing any more
            proc.kill()
            proc.wait(10.0)
        finally:
            if self._reader is not None:
                self._reader.join(5.0)
            if proc.stdout is not None:
                proc.stdout.close()


# ---------------------------------------------------------------------- the child


def _report(out: IO[str], **line: Any) -> None:
    out.write(json.dumps(line) + "\n")
    out.flush()


def _watch_stdin(stop: threading.Event) -> None:
    """Set ``stop`` once stdin ends (the parent closed it, or died)."""
    with contextlib.suppress(OSError, ValueError):
        while sys.stdin.buffer.read(1):
            pass
    stop.set()


def _as_json(applied: Mapping[int, int]) -> dict[str, int]:
    return {str(p): int(o) for p, o in applied.items()}


def replay_main() -> int:
    """The child: replay the spec's topic into its file until stdin ends; exit code 0 once done."""
    from throughline.runtime import die_with_parent

    out = sys.stdout
    spec: dict[str, Any] = pickle.load(sys.stdin.buffer)
    die_with_parent()
    if os.getppid() != spec["parent"]:
        return 1  # the parent died before the signal was armed
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, int(spec["nice"]))
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    threading.Thread(target=_watch_stdin, args=(stop,), name="throughline-replay-stop", daemon=True).start()
    try:
        from throughline.projector.rebuild_files import turn_keys_of
        from throughline.projector.runner import ProgressUpdate, Projector, ProjectorOptions
        from throughline.projector.store import DuckProjection

        last = [0.0]

        def progress(update: ProgressUpdate) -> None:
            now = time.monotonic()
            if now - last[0] >= REPORT_EVERY:
                last[0] = now
                _report(out, applied=_as_json(update.applied))

        options = ProjectorOptions(poll_timeout=REPLAY_POLL_TIMEOUT)
        with DuckProjection.open(spec["path"], topic=spec["topic"], sync_commits=spec["sync_commits"]) as projection:
            kept = projection.keep_turn_keys()
            _report(out, applied=_as_json(projection.applied_offsets()))
            Projector(
                projection, spec["servers"], spec["topic"], options=options, kafka_config=spec["kafka_config"]
            ).run(stop=stop, progress=progress)
            applied = projection.applied_offsets()
            if kept:
                try:
                    projection.save_turn_keys(turn_keys_of(Path(spec["path"])))
                except OSError as exc:  # serve scans turn_ids for them instead
                    logging.getLogger(REPLAY_MODULE).warning("the turn keys are not handed over: %s", exc)
        _report(out, applied=_as_json(applied), done=True)
        return 0
    except Exception as exc:  # the parent reports it (the rebuild fails; the live file keeps serving)
        _report(out, error=f"{exc.__class__.__name__}: {exc}")
        return 1


if __name__ == "__main__":
    code = replay_main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Without the interpreter's teardown: the file is closed and reported, and a full collection of the
    # replay's heap (~150 ms of a core, measured) would only take a core from serve.
    os._exit(code)
