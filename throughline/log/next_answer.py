"""``NextAnswer``: concurrent callers share one broker request, but never one asked before they called.

A read's end offset must be "the log at the time of the call": asked of the broker after the call
began, never answered from a cache. In ``serve`` every read asks (one ListOffsets request), and the
log view's consumer is not thread-safe, so concurrent reads used to queue for it, each paying for the
requests of those ahead of it. ``NextAnswer`` lets the callers that arrive while a request is in
flight wait for the *next* request and share its answer: that request is sent after every one of
them arrived, so each gets an answer at least as fresh as one it had asked for itself, after at most
two round trips (the one in flight, then theirs) instead of one per caller ahead of it.

A request that fails is the asking caller's failure only: the callers that waited for it ask again
themselves (failures are rare; sharing one exception object between threads is not worth it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class NextAnswer(Generic[T]):
    """Calls ``ask`` for callers of ``get``; callers that overlap share a call begun after they did."""

    def __init__(self, ask: Callable[[], T]) -> None:
        self._ask = ask
        self._cond = threading.Condition()
        self._asking = False
        self._done = 0  # requests completed
        self._last: tuple[bool, T | None] = (False, None)  # (succeeded, answer) of the last request

    def get(self) -> T:
        """An answer of ``ask`` called after this call began (raises what ``ask`` raised)."""
        with self._cond:
            # The request that answers us is the first to start after now: the one after the request
            # in flight, if there is one.
            wanted = self._done + (2 if self._asking else 1)
            while self._done < wanted and self._asking:
                self._cond.wait()
            if self._done >= wanted:
                ok, answer = self._last
                if ok:
                    return answer  # type: ignore[return-value]
                # It failed: ask ourselves, below, without sharing.
            else:
                self._asking = True
                return self._ask_for_all()
        return self._ask()

    def _ask_for_all(self) -> T:
        # Called with the condition held and ``_asking`` set; asks without holding it.
        self._cond.release()
        ok = False
        answer: T | None = None
        try:
            answer = self._ask()
            ok = True
            return answer
        finally:
            self._cond.acquire()
            self._asking = False
            self._done += 1
            self._last = (ok, answer)
            self._cond.notify_all()
