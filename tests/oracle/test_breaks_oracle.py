"""The read-series oracle over histories with broken and repaired sources (docs/oracle.md, "Breaks and repairs").

The same model, checker and driver as ``test_read_series_oracle.py``, with the grammar's ``Gap`` steps (a
turn whose seq leaves a gap: quarantined, its source broken) and ``Mend`` steps (an operator's repair
record). The law ``quarantine-exact``: a read naming a broken source (through it, after it, or pinning
it as the head) is the hard error ``source_quarantined``, exactly when the model says so; once a repair
is applied the source is served again, exactly its chain as applied (the other laws, unchanged).

Targets: the in-memory ``BookProjection`` and the production DuckDB projection, both with gaps and
repairs (the store applies repair records in its batch transaction, ``projector/store/transaction.py``).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import pytest
from support.projection import PassThroughView, PassThroughWaits

from throughline.core.ports import ProjectionView

from .conftest import ENV_BLOB
from .driver import BookTarget, Driver, duck_target_factory, production_reader, run_history
from .grammar import Append, Apply, Gap, Mend, Next, Pick, Reread, Start, Step, histories
from .test_read_series_oracle import EXAMPLES, _print_coverage, oracle_property

#: Shares of the fixed-seed run's histories that must reach each case (see FIXED_SEED_COVERAGE).
BREAKS_COVERAGE = {
    "a source broken by a gap": 0.5,
    "page source_quarantined": 0.2,
    "page ok": 0.5,
}
REPAIRS_COVERAGE = {
    **BREAKS_COVERAGE,
    "a repair record appended": 0.3,
    "page ok of a source a repair mended": 0.1,
}


def _guard(coverage: Counter[str], shares: dict[str, float]) -> None:
    if os.environ.get(ENV_BLOB) or EXAMPLES < 30:
        return  # a replay or a reduced budget is not the calibrated campaign
    for name, share in shares.items():
        assert coverage[name] >= share * coverage["histories"], f"the run lost coverage of {name!r}"


def test_breaks_and_repairs_fixed_seed(oracle_fixed_seed: int) -> None:
    coverage: Counter[str] = Counter()
    oracle_property(
        oracle_fixed_seed, target=BookTarget, coverage=coverage, strategy=histories(breaks=True, repairs=True)
    )()
    _print_coverage(f"breaks and repairs, oracle seed {oracle_fixed_seed} (book)", coverage)
    _guard(coverage, REPAIRS_COVERAGE)


def test_breaks_and_repairs_unseeded(oracle_seed: int) -> None:
    coverage: Counter[str] = Counter()
    oracle_property(oracle_seed, target=BookTarget, coverage=coverage, strategy=histories(breaks=True, repairs=True))()
    _print_coverage(f"breaks and repairs, oracle seed {oracle_seed} (book)", coverage)


def test_breaks_and_repairs_on_the_duckdb_projection_fixed_seed(oracle_fixed_seed: int) -> None:
    factory = duck_target_factory()
    assert factory is not None
    coverage: Counter[str] = Counter()
    oracle_property(
        oracle_fixed_seed,
        target=factory,
        coverage=coverage,
        strategy=histories(breaks=True, repairs=True),
    )()
    _print_coverage(f"breaks and repairs, oracle seed {oracle_fixed_seed} (duckdb)", coverage)
    _guard(coverage, REPAIRS_COVERAGE)


# ---------------------------------------------------------------------------------- pinned history

#: alpha's first source has three turns; a delta series of one turn a page starts from seq 1; a turn
#: with seq 6 leaves a gap (the source breaks) under the open series; its next page is refused; a repair
#: record is appended and applied; the series finishes with the chain as applied (seq 2, 3); a turn with
#: the next seq (4) appends and a delta series from the saved cursor serves exactly it.
BREAK_AND_MEND: list[Step] = [
    Append(0, 0, "one"),
    Append(0, 0, "two"),
    Append(0, 0, "three"),
    Apply(None),
    Start(0, Pick("prefix", 0, 0), None, 1, 1 << 20),  # after = seq 1: page (1, 2] of (1, 3]
    Gap(0, 0, 0, "lost its predecessor"),
    Apply(None),  # seq 3 + 2 = 5: a gap
    Next(0),  # source_quarantined
    Reread(0, 0),  # so is the page read before
    Start(0, None, None, 10, 1 << 20),  # a snapshot pins the broken head: refused
    Mend(0, 0),
    Apply(None),
    Next(0),  # page (2, 3]: the series completes
    Append(0, None, "four"),
    Apply(None),  # seq 4 = length + 1 appends
    Start(0, Pick("saved", 0, 0), None, 10, 1 << 20),  # the delta from the saved cursor: seq 4 only
]


@pytest.mark.parametrize("target", ["book", "duckdb"])
def test_a_broken_source_is_refused_then_served_again_after_its_repair(target: str) -> None:
    factory = BookTarget if target == "book" else duck_target_factory()
    assert factory is not None
    driver = run_history(BREAK_AND_MEND, target=factory)
    assert driver.stats["page source_quarantined"] == 2  # the Next and the snapshot (the re-read is counted apart)
    assert driver.stats["re-read error"] == 1
    assert driver.stats["completed multi-page series"] >= 1
    delta = driver.series[2]  # the history's third series (the scoped epilogue's series follow it)
    assert [t["seq"] for p in delta.pages for t in p.wire["turns"]] == [4]
    assert driver.stats["page ok of a source a repair mended"] >= 2


def test_without_the_repair_the_source_stays_refused() -> None:
    unmended = [s for s in BREAK_AND_MEND if not isinstance(s, Mend)]
    for target in (BookTarget, duck_target_factory()):
        assert target is not None
        driver = run_history(unmended, target=target)
        assert driver.stats["page ok of a source a repair mended"] == 0
        assert driver.stats["page source_quarantined"] >= 3


# ------------------------------------------------------------------------------------- calibration


@dataclass
class _Forgetful(PassThroughView):
    """A projection view that forgets (``forget=True``) or invents (``forget=False``) broken marks."""

    forget: bool

    def source(self, source_sha256: bytes) -> Any:
        info = self.inner.source(source_sha256)
        if info is None:
            return None
        return replace(info, broken_reason=None if self.forget else "stays broken")

    def turns(self, source_sha256: bytes, first_seq: int, last_seq: int) -> Any:
        return self.inner.turns(source_sha256, first_seq, last_seq)


@dataclass
class _ForgetfulProjection(PassThroughWaits):
    forget: bool

    @contextmanager
    def view(self) -> Iterator[ProjectionView]:
        with self.inner.view() as inner:
            yield _Forgetful(inner, self.forget)


def _reader_over(forget: bool) -> Callable[..., Any]:
    def read(**kwargs: Any) -> Any:
        return production_reader()(**{**kwargs, "projection": _ForgetfulProjection(kwargs["projection"], forget)})

    return read


def test_calibration_a_reader_that_serves_broken_sources_is_rejected() -> None:
    with pytest.raises(AssertionError, match=r"oracle law \[quarantine-exact\]"):
        run_history(BREAK_AND_MEND, reader=_reader_over(forget=True), target=BookTarget)


def test_calibration_a_reader_that_never_serves_a_repaired_source_again_is_rejected() -> None:
    with pytest.raises(AssertionError, match=r"oracle law \[quarantine-exact\]"):
        run_history(BREAK_AND_MEND, reader=_reader_over(forget=False), target=BookTarget)


def test_calibration_the_property_rejects_a_reader_that_serves_broken_sources(oracle_fixed_seed: int) -> None:
    with pytest.raises(AssertionError, match=r"oracle law \["):
        oracle_property(
            oracle_fixed_seed,
            reader=_reader_over(forget=True),
            shrink=False,
            target=BookTarget,
            strategy=histories(breaks=True, repairs=True),
        )()


def test_calibration_production_passes_the_pinned_history() -> None:
    driver: Driver = run_history(BREAK_AND_MEND, target=BookTarget)
    assert driver.stats["page source_quarantined"] == 2
