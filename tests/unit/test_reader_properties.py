"""Properties of the reader over generated histories, checked against a model made of plain lists.

The model knows each thread's turns as a list of bodies and which thread completed a turn last; it does
not use the production fold, cursor or page arithmetic. Each generated step appends, rewinds a thread,
or runs a whole read series (pages in order, with turns completing between pages). The checks: a
series serves exactly the model's range at pin time (no gap, no duplicate, nothing completed mid-series),
snapshots are the latest ``limit`` turns, and a rollback under the saved cursor answers
``resync_required``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import event, given, settings
from hypothesis import strategies as st
from reader_world import PROJECT, World
from support.cursor import cursor_length

from throughline.core.identity import project_sha256, source_sha256

THREADS = ("thread-a", "thread-b", "thread-c")


@dataclass
class Model:
    chains: dict[str, list[str]] = field(default_factory=dict)
    head: str | None = None
    # What the Observer audited last: (thread, the chain prefix it had audited through).
    saved: tuple[str, list[str]] | None = None


append = st.tuples(st.just("append"), st.sampled_from(THREADS), st.integers(1, 15))
rewind = st.tuples(st.just("rewind"), st.sampled_from(THREADS), st.floats(0, 1))
series = st.tuples(st.just("series"), st.integers(1, 5), st.lists(st.sampled_from(THREADS), max_size=4))
steps = st.lists(st.one_of(append, rewind, series), min_size=1, max_size=30)


@settings(max_examples=100, deadline=None)
@given(steps)
def test_series_serve_exactly_the_pinned_range(history: list[tuple]) -> None:
    world = World()
    model = Model()
    after: str | None = None
    counter = 0

    def do_append(thread: str, seq: int | None = None) -> None:
        nonlocal counter
        counter += 1
        body = f"b{counter}"
        world.append(thread=thread, body=body, seq=seq)
        chain = model.chains.setdefault(thread, [])
        if seq is not None:
            del chain[seq - 1 :]
        chain.append(body)
        model.head = thread

    for step in history:
        if step[0] == "append":
            for _ in range(step[2]):
                do_append(step[1])
        elif step[0] == "rewind":
            _, thread, fraction = step
            length = len(model.chains.get(thread, []))
            if length:
                do_append(thread, max(1, min(length, round(length * fraction))))
        else:
            _, limit, mid_series = step
            # The first page pins before any mid-series append: the model's head now is the pin.
            head = model.head
            chain = list(model.chains[head]) if head is not None else []
            queue = list(mid_series)
            pages = world.series(after=after, limit=limit, between_pages=lambda q=queue: q and do_append(q.pop(0)))
            served = [t.body for p in pages for t in p.turns]
            event(f"pages={min(len(pages), 3)} status={pages[-1].status}")
            status = pages[-1].status
            if head is None:
                assert status == "ok" and served == [] and pages[0].throughCursor is None
                continue
            if model.saved is None:
                assert status == "ok"
                assert served == chain[-limit:]
                assert pages[0].historyTruncated == (len(chain) > limit)
            else:
                saved_thread, saved_prefix = model.saved
                current = model.chains[saved_thread]
                if current[: len(saved_prefix)] != saved_prefix:
                    assert status == "resync_required" and served == []
                    after, model.saved = None, None
                    continue
                assert status == "ok"
                assert served == (chain[len(saved_prefix) :] if saved_thread == head else chain)
                assert all(not p.historyTruncated for p in pages)
            assert pages[0].thread is not None and pages[0].thread.sourceSha256 == _source_hex(head)
            assert cursor_length(pages[0].throughCursor) == len(chain)
            assert all(len(p.turns) <= limit for p in pages)
            after = pages[0].throughCursor
            model.saved = (head, chain)


def _source_hex(thread: str) -> str:
    return source_sha256(project_sha256(PROJECT), "host-alpha", thread).hex()
