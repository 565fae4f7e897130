"""Process-level behaviour shared by every command: GC tuning for bulk work, stop on signals, die with parent.

- ``fewer_gc_passes``: the bulk paths (projector runs, the fetch worker, ``send_many``);
- ``prompt_gil_handoffs``: projector runs (in ``serve`` the writer shares the GIL with HTTP threads);
- ``StopOnSignals``: SIGTERM/SIGINT handling of ``project``, ``replay``, ``ingest`` and ``serve``;
- ``die_with_parent``: the fetch worker and the test harness's broker never outlive their parent.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

#: The first-generation threshold the bulk paths raise Python's cyclic GC to (default: 700).
BULK_GC_THRESHOLD = 50_000


class _SharedSetting:
    """A process-wide setting that blocks on several threads may ask for at once (``serve`` runs two
    projector runs side by side during a rebuild's switch): the first block in saves it, each block
    applies its value if ``stronger`` than the current one, and the last block out restores what was
    saved. (Each block restoring what it found, the run that ended first put the defaults back under
    the run still going: after a rebuild's switch the live projector ran at Python's defaults.)"""

    def __init__(self, read: Callable[[], Any], write: Callable[[Any], object]) -> None:
        self._read = read
        self._write = write
        self._lock = threading.Lock()
        self._holders = 0
        self._saved: Any = None

    @contextmanager
    def held(self, value: Any, stronger: Callable[[Any, Any], bool]) -> Iterator[None]:
        with self._lock:
            if self._holders == 0:
                self._saved = self._read()
            self._holders += 1
            if stronger(value, self._read()):
                self._write(value)
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0:
                    self._write(self._saved)


_gc_threshold = _SharedSetting(gc.get_threshold, lambda t: gc.set_threshold(*t))
_switch_interval = _SharedSetting(sys.getswitchinterval, sys.setswitchinterval)


@contextmanager
def fewer_gc_passes(threshold: int | None = BULK_GC_THRESHOLD) -> Iterator[None]:
    """Raise the cyclic GC's first-generation threshold to ``threshold`` while the block runs.

    Bulk work creates thousands of tracked objects (futures, records, rows) per batch; at the default
    threshold the collector walks them again and again (25-35% of the projector's apply time, and a
    quarter of ``send_many``'s). Nothing is leaked: collection still runs, just less often. The
    setting is process-wide, restored once the last block asking for it ends; ``None`` leaves it alone.
    """
    if threshold is None:
        yield
        return
    with _gc_threshold.held((threshold, *gc.get_threshold()[1:]), lambda new, now: new[0] > now[0]):
        yield


#: The GIL switch interval projector runs use (Python's default: 5 ms).
PROJECTOR_SWITCH_INTERVAL = 0.0005


@contextmanager
def prompt_gil_handoffs(interval: float | None = PROJECTOR_SWITCH_INTERVAL) -> Iterator[None]:
    """Lower the interpreter's GIL switch interval to ``interval`` seconds while the block runs.

    DuckDB's binding releases the GIL while a statement runs and takes it back several times a
    statement (parameters, result); each time another thread holds it, the writer waits until that
    thread is asked to let go, up to the switch interval. A small transaction is ~6 such calls, so with
    ``serve``'s HTTP threads busy, its wall time was several times its CPU time. The setting is
    process-wide, restored once the last block asking for it ends; ``None`` leaves it alone.
    """
    if interval is None:
        yield
        return
    with _switch_interval.held(interval, lambda new, now: new < now):
        yield


# ------------------------------------------------------------------------------------------- signals


class StopOnSignals:
    """SIGTERM and SIGINT while a block runs: the first asks for a graceful stop, a second for more.

    ``first(signum)`` runs on the first signal (set a stop event, begin a drain); ``second(signum)`` on
    every later one, by default ``KeyboardInterrupt`` (stop whatever is running now). Handlers are
    installed only from the main thread, where Python delivers signals, and the previous ones are
    restored on exit. ``signals`` lists what arrived, in order, for the caller's exit code.
    """

    def __init__(self, first: Callable[[int], None], second: Callable[[int], None] | None = None) -> None:
        self._first = first
        self._second = second
        self.signals: list[int] = []
        self._previous: dict[int, Any] = {}

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        """The handler itself (public so that a test can call it without sending a signal)."""
        self.signals.append(signum)
        if len(self.signals) == 1:
            self._first(signum)
        elif self._second is not None:
            self._second(signum)
        else:
            raise KeyboardInterrupt

    @property
    def exit_code(self) -> int:
        """130 when SIGINT asked for the stop (a shell's convention for ^C), else 0."""
        return 130 if self.signals[:1] == [signal.SIGINT] else 0

    def __enter__(self) -> StopOnSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self.handle)
        return self

    def __exit__(self, *_: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()


# ------------------------------------------------------------------------------------ die with parent

_PR_SET_PDEATHSIG = 1


@functools.cache
def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(signum: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send this process ``signum`` when the thread that started it ends (Linux only).

    ``False`` where it cannot be armed; a caller that must not outlive its parent also checks
    ``os.getppid()`` (the parent may have died before this call).
    """
    prctl = _prctl()
    return prctl is not None and prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0


def die_with_parent_preexec(signum: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that arms ``die_with_parent(signum)`` in a child before it execs, or ``None``.

    Only from the main thread: the kernel ties the signal to the *thread* that forked, so a child
    started from a short-lived thread would be killed when that thread ends. libc is resolved here,
    before the fork, so the child does no loading between fork and exec.
    """
    if threading.current_thread() is not threading.main_thread() or _prctl() is None:
        return None

    def preexec() -> None:
        die_with_parent(signum)

    return preexec
