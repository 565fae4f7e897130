"""``SpareAhead``: the new file's fetch worker started with ``serve`` and handed to the first rebuild that
asks (its start then costs the reads nothing); later rebuilds start their own; ``serve`` stopping stops
the spare nobody took, and none starts after."""

from __future__ import annotations

import threading

from throughline.serve.rebuild import SpareAhead


class Worker:
    def __init__(self, n: int) -> None:
        self.n = n
        self.stopped = 0

    def stop(self) -> None:
        self.stopped += 1


class Starts:
    def __init__(self) -> None:
        self.made: list[Worker] = []

    def __call__(self) -> Worker:
        self.made.append(Worker(len(self.made)))
        return self.made[-1]


def test_the_first_rebuild_gets_the_spare_started_before_it_asked() -> None:
    starts = Starts()
    spare = SpareAhead(starts)
    assert starts.made == []  # nothing until serve prepares it
    spare.prepare()
    spare.prepare()  # once
    assert len(starts.made) == 1
    first = spare()
    assert first is starts.made[0] and len(starts.made) == 1  # handed over, not started anew
    second = spare()
    assert second is starts.made[1]  # a later rebuild starts its own
    spare.close()
    assert first.stopped == 0 and second.stopped == 0  # the callers' from the hand-over on


def test_closing_stops_the_spare_nobody_took_and_prepares_no_more() -> None:
    starts = Starts()
    spare = SpareAhead(starts)
    spare.prepare()
    spare.close()
    assert starts.made[0].stopped == 1
    spare.prepare()
    assert len(starts.made) == 1
    spare.close()
    assert starts.made[0].stopped == 1  # stopped once


def test_a_spare_is_handed_to_one_caller_only() -> None:
    starts = Starts()
    spare = SpareAhead(starts)
    spare.prepare()
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(spare())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10.0)
    assert len(got) == 8 and len({id(w) for w in got}) == 8  # the spare once, seven started anew
    assert starts.made[0] in got and len(starts.made) == 8
