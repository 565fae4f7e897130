"""``InFlight.settled`` is exactly the proof docs/spec.md#scoped-wait allows, over generated fetch/apply runs.

A run is one partition's log (each offset a record of project A, B, one whose project is unknown, or
no record at all: a transaction marker), fetched contiguously from a start in polls of any size and
applied in steps of any size (never past what was fetched, as the projector works; the oracle also
applies without fetching, which only moves the applied offset). After every step, for each project and
every bound: ``settled`` must be True exactly when the applied offset reaches the bound, or the fetches
reach it and no record of that project or of an unknown project sits between the applied offset and
the bound.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from throughline.core.inflight import UNKNOWN, InFlight

A, B = b"a" * 32, b"b" * 32
MARKER = "marker"  # an offset that holds no record

slots = st.sampled_from([A, B, UNKNOWN, MARKER])
steps = st.lists(
    st.tuples(st.sampled_from(["fetch", "apply", "apply_unfetched", "restart"]), st.integers(0, 4)), max_size=25
)


def _expected(log: list[object], project: bytes, below: int, applied: int, fetched: int) -> bool:
    if applied >= below:
        return True
    if max(fetched, applied) < below:
        return False
    return all(log[o] not in (project, UNKNOWN) for o in range(applied, below))


@settings(max_examples=300, deadline=None)
@given(st.lists(slots, max_size=20), st.integers(0, 3), steps)
def test_settled_is_exactly_the_proof(log: list[object], start: int, run: list[tuple[str, int]]) -> None:
    n = len(log)
    applied = min(start, n)
    fetched = applied
    flight = InFlight()
    flight.start({0: applied})
    for kind, k in run:
        if kind == "fetch":
            end = min(n, max(fetched, applied) + k)
            first = max(fetched, applied)
            records = [(o, log[o]) for o in range(first, end) if log[o] is not MARKER]
            flight.add(0, records, end)  # type: ignore[arg-type]
            fetched = end
        elif kind == "apply":
            applied = min(max(fetched, applied), applied + k)
            flight.applied(0, applied)
        elif kind == "apply_unfetched":
            applied = min(n, applied + k)
            flight.applied(0, applied)
        else:  # the feed restarts at the applied offset: what was in flight is forgotten
            flight.start({0: applied})
            fetched = applied
        for project in (A, B):
            for below in range(n + 2):
                want = _expected(log, project, below, applied, fetched)
                assert flight.settled(0, project, below, applied) is want, (kind, project, below, applied, fetched)
                if want:  # soundness, stated directly: every record of the project below is applied
                    assert all(o < applied for o in range(min(below, n)) if log[o] in (project, UNKNOWN))


def test_without_a_start_only_the_applied_offset_proves_anything() -> None:
    flight = InFlight()
    flight.add(0, [(5, B)], 6)  # where these fetches began is unknown
    assert not flight.settled(0, A, 6, applied=4)
    assert flight.settled(0, A, 4, applied=4)
