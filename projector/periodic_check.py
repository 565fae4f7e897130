"""``PeriodicCheck``: the projector's check of the log every ``check_interval`` seconds, off its thread.

The check (topic identity, end and first offsets against the applied ones) builds an admin client and
asks the broker three things: 15-20 ms on an idle machine, two or three times that under load. Run on
the projector's thread it stalled applying for that long every five seconds, a freshness tail every
turn that arrived meanwhile paid. On its own thread it stalls nothing (its waits are network waits,
which release the GIL), and the loop still meets its verdict: what the check raised is raised again
on the loop's thread at its next turn (``raise_pending``), inside the same ``try`` that handled it
when the loop ran the check itself. A retriable failure is then explained and retried there; the
thread goes on checking on its schedule.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType

#: How long closing waits for a check in flight. Not for its verdict (nobody collects it once the loop
#: is over): a check still asking a broker that does not answer ends on its own, bounded by its
#: clients' timeout, and must not hold up a projector that is stopping (``--drain-timeout``).
_JOIN_S = 1.0


class PeriodicCheck:
    """Runs ``check`` every ``interval`` seconds on a daemon thread while the block runs."""

    def __init__(self, check: Callable[[], object], interval: float, *, name: str = "throughline-log-check") -> None:
        self._check = check
        self._interval = interval
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pending: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self) -> PeriodicCheck:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=_JOIN_S)

    def raise_pending(self) -> None:
        """Raise (once) what the last check raised, if anything; called by the loop's thread."""
        with self._lock:
            failure, self._pending = self._pending, None
        if failure is not None:
            raise failure

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._check()
            except BaseException as exc:  # the loop's to judge, on its own thread
                with self._lock:
                    if self._pending is None:  # keep the first: the loop has not seen it yet
                        self._pending = exc
