"""The read-series oracle (docs/oracle.md): a model-based property over production read series.

Runs: ``test_read_series_oracle_fixed_seed`` (seed 20260715) and ``test_read_series_oracle_unseeded``
(a fresh seed each run, printed in the terminal summary; ``THROUGHLINE_ORACLE_SEED=N`` replays it), with
the same budget. Calibration: the checker must reject a reader, built here, that re-reads the latest head
on every page. Pinned histories reconstruct the cases the named mutants break.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, given, note, reproduce_failure, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.strategies import SearchStrategy

from throughline.core.identity import project_sha256
from throughline.core.page_token import SeriesBinding, issue_page_token, open_page_token
from throughline.reader.wire import PageWire

from .conftest import ENV_BLOB, ENV_EXAMPLES, ENV_SEED, ENV_TARGET
from .driver import (
    BookTarget,
    Driver,
    StagedDuckTarget,
    Target,
    duck_target_factory,
    production_reader,
    run_history,
)
from .grammar import Append, Apply, Damage, Fetch, Next, Pick, Replay, Reread, Rewind, Start, Step, histories

ORACLE_DIR = Path(__file__).resolve().parent
EXAMPLES = int(os.environ.get(ENV_EXAMPLES, "100"))


def target_factory() -> Callable[[], Target]:
    """DuckDB (the production projection) unless ``THROUGHLINE_ORACLE_TARGET=book``."""
    if os.environ.get(ENV_TARGET, "duckdb") == "book":
        return BookTarget
    factory = duck_target_factory()
    assert factory is not None, "the production DuckDB projection (throughline.projector.store) is missing"
    return factory


def oracle_property(
    seed_value: int,
    *,
    reader: Callable[..., Any] | None = None,
    examples: int = EXAMPLES,
    shrink: bool = True,
    target: Callable[[], Target] | None = None,
    coverage: Counter[str] | None = None,
    strategy: SearchStrategy[list[Step]] | None = None,
) -> Callable[[], None]:
    """The property, seeded; a failure prints the seed and the ``@reproduce_failure`` blob.

    ``coverage`` counts, per kind of event, the generated histories that had it. ``strategy``: the
    histories (default ``histories()``, the calibrated grammar; ``test_breaks_oracle.py`` passes the
    grammar with breaks and repairs).
    """
    # No explain phase: it re-runs many variations of a counterexample and costs minutes on DuckDB.
    phases = (Phase.explicit, Phase.generate, Phase.shrink) if shrink else (Phase.explicit, Phase.generate)
    make = target or target_factory()
    seen = coverage if coverage is not None else Counter()

    @hypothesis_seed(seed_value)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        print_blob=True,
        report_multiple_bugs=False,
        phases=phases,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(strategy if strategy is not None else histories())
    def read_series_oracle(steps: list[Step]) -> None:
        note(f"oracle seed {seed_value} (replay: {ENV_SEED}={seed_value})")
        driver = run_history(steps, reader=reader, target=make)
        seen["histories"] += 1
        for name in driver.stats:
            event(name)
            seen[name] += 1

    blob = os.environ.get(ENV_BLOB, "").strip()
    if blob:
        import hypothesis

        replay: Callable[[], None] = reproduce_failure(hypothesis.__version__, blob.encode("ascii"))(read_series_oracle)
        return replay
    return read_series_oracle


# ------------------------------------------------------------------------------------------ property


#: What the fixed-seed run must exercise, as a share of its histories (a guard against a generator that
#: silently stops reaching a law's case; the run's coverage is printed with ``-s``).
FIXED_SEED_COVERAGE = {
    "completed multi-page series": 0.2,
    "turns completed during a multi-page series": 0.15,
    "completed snapshot series": 0.2,
    "page projection_pending": 0.3,
    "page pending: the projection lacks or garbles a row": 0.1,
    "page resync_required": 0.2,
    "re-read ok": 0.2,
    "token replayed with another through": 0.2,
    "pages of two series interleaved": 0.05,
    "page whose after cursor's record is unapplied, its through cursor's applied": 0.1,
    "epilogue: ok while the other project's turn is in flight": 1.0,
    "epilogue: pending while its own turn is in flight": 1.0,
}


def _print_coverage(title: str, coverage: Counter[str]) -> None:
    print(f"{title}: {coverage['histories']} histories")
    for name, count in sorted(coverage.items()):
        if name != "histories":
            print(f"  {count:5}  {name}")


def test_read_series_oracle_fixed_seed(oracle_fixed_seed: int) -> None:
    coverage: Counter[str] = Counter()
    oracle_property(oracle_fixed_seed, coverage=coverage)()
    _print_coverage(f"oracle seed {oracle_fixed_seed}", coverage)
    if os.environ.get(ENV_BLOB) or EXAMPLES < 30:
        return  # a replay or a reduced budget is not the calibrated campaign
    for name, share in FIXED_SEED_COVERAGE.items():
        assert coverage[name] >= share * coverage["histories"], f"the fixed-seed run lost coverage of {name!r}"


def test_read_series_oracle_over_staged_layers(oracle_fixed_seed: int) -> None:
    """The same property over the projection as ``serve`` feeds it: each applied batch readable from a
    staged layer before its commit (``StagedDuckTarget``)."""
    coverage: Counter[str] = Counter()
    oracle_property(oracle_fixed_seed, coverage=coverage, target=StagedDuckTarget, examples=max(1, EXAMPLES // 2))()
    _print_coverage(f"oracle seed {oracle_fixed_seed}, staged layers", coverage)
    assert coverage["page projection_pending"] > 0 and coverage["completed multi-page series"] > 0


def test_read_series_oracle_unseeded(oracle_seed: int) -> None:
    print(f"oracle seed {oracle_seed} (replay: {ENV_SEED}={oracle_seed})")
    coverage: Counter[str] = Counter()
    oracle_property(oracle_seed, coverage=coverage)()
    _print_coverage(f"oracle seed {oracle_seed}", coverage)


# ---------------------------------------------------------------------------------- pinned histories

#: Three turns on alpha's first source; a delta series of one turn a page from after seq 1; a new turn
#: completes between its pages; then its pages are read again and its token is replayed.
TURNS_COMPLETE_BETWEEN_PAGES: list[Step] = [
    Append(0, 0, "one"),
    Append(0, 0, "two"),
    Append(0, 0, "three"),
    Apply(None),
    Start(0, Pick("prefix", 0, 0), None, 1, 1 << 20),  # after = seq 1: range (1, 3], page (1, 2]
    Append(0, None, "completed mid-series"),
    Apply(None),
    Next(0),  # page (2, 3]; seq 4 must not appear
    Reread(0, 0),
    Reread(0, 1),
    Replay(0, 0, "through"),
    Replay(0, 0, "after"),
    Replay(0, 0, "project"),
]

#: The projection lacks row 1 of a three-turn chain, then garbles row 2, while its applied offset is
#: current: a snapshot and a delta over them must be projection_pending, never a partial ok page.
MISSING_ROW: list[Step] = [
    Append(0, 0, "one"),
    Append(0, 0, "two"),
    Append(0, 0, "three"),
    Apply(None),
    Damage(0, 0, 2, "hide"),  # row 3 - 2 = 1
    Start(0, None, None, 10, 1 << 20),  # snapshot (0, 3]: lacks row 1
    Damage(0, 0, 1, "alter"),  # row 2's body no longer matches its digest
    Start(0, Pick("prefix", 0, 0), None, 1, 1 << 20),  # delta page (1, 2]: row 2 disagrees
]

#: A rollback under a series' through cursor between its pages, and a through cursor not yet applied.
ROLLBACK_AND_LAG: list[Step] = [
    Append(0, 0, "one"),
    Append(0, 0, "two"),
    Append(0, 0, "three"),
    Apply(None),
    Start(0, Pick("prefix", 0, 0), None, 1, 5),  # after = seq 1: page (1, 2] of (1, 3]
    Append(0, 1, "switch"),  # another thread completes: the head switches
    Start(0, Pick("tip", 0, 0), Pick("tip", 1, 0), 2, 5),  # its through is not applied: pending
    Rewind(0, 0, 2, "rewound"),
    Apply(None),  # seq 1..3 replaced: both series must resync
    Next(0),
    Next(1),
]


#: A later page whose after cursor's record is still unapplied while its through cursor's is applied: the
#: after cursor names a turn on another thread, completed after the through cursor's; every read of the
#: series must be pending until the projector applies it (a reader that waits for the through cursor's
#: record alone answers resync_required: the after cursor's source is not in the projection yet).
AFTER_UNAPPLIED: list[Step] = [
    Append(0, 0, "one"),
    Append(0, 0, "two"),
    Append(0, 0, "three"),
    Apply(None),
    Append(0, 1, "on another thread"),  # not applied yet
    Start(0, Pick("pending", 0, 0), Pick("applied", 0, 0), 1, 1 << 20),  # after (h1,t2) seq 1, through (h1,t1) seq 3
    Next(0),  # a later read of it: still pending
    Apply(1),
    Next(0),
    Next(0),  # now its pages: (0, 1], (1, 2] of (0, 3]
]


#: The wait scoped to the project (docs/spec.md#scoped-wait): beta's records fetched but not applied must not
#: make alpha's first page pending; alpha's own record in flight must, and so must a record not fetched
#: yet (whose project the projector cannot know).
OTHER_PROJECT_LAG: list[Step] = [
    Append(0, 0, "a1"),
    Append(0, 0, "a2"),
    Apply(None),
    Append(1, 0, "b1"),
    Append(1, 0, "b2"),
    Fetch(None),
    Start(0, None, None, 10, 1 << 20),  # ok: neither record in flight is alpha's
    Append(0, None, "a3"),
    Fetch(None),
    Start(0, Pick("prefix", 0, 0), None, 1, 1 << 20),  # pending: alpha's a3 is fetched, not applied
    Apply(None),
    Append(1, 0, "b3"),
    Start(0, Pick("prefix", 0, 0), None, 1, 1 << 20),  # pending: b3 is not fetched, its project unknown
    Fetch(None),
    Next(0),
    Next(1),  # both pending series now read ok, b3 still in flight
]


@pytest.mark.parametrize(
    "steps",
    [TURNS_COMPLETE_BETWEEN_PAGES, MISSING_ROW, ROLLBACK_AND_LAG, AFTER_UNAPPLIED, OTHER_PROJECT_LAG],
    ids=["turns-complete-between-pages", "missing-row", "rollback-and-lag", "after-unapplied", "other-project-lag"],
)
def test_pinned_history(steps: list[Step]) -> None:
    driver = run_history(steps, target=target_factory())
    assert driver.reads > 0


def test_pinned_histories_reach_their_cases() -> None:
    """The pinned histories exercise what they claim (a guard against a silently vacuous history)."""
    between = run_history(TURNS_COMPLETE_BETWEEN_PAGES, target=BookTarget)
    assert between.stats["turns completed during a multi-page series"] == 1
    assert between.stats["re-read ok"] == 2
    assert all(between.stats[f"token replayed with another {v}"] >= 1 for v in ("project", "after", "through"))
    missing = run_history(MISSING_ROW, target=BookTarget)
    assert missing.stats["page projection_pending"] >= 2
    rolled = run_history(ROLLBACK_AND_LAG, target=BookTarget)
    assert rolled.stats["page resync_required"] >= 1 and rolled.stats["page projection_pending"] >= 1
    ahead = run_history(AFTER_UNAPPLIED, target=BookTarget)
    assert ahead.stats["page whose after cursor's record is unapplied, its through cursor's applied"] == 2
    assert ahead.stats["page projection_pending"] == 2 and ahead.stats["completed host/thread switch series"] == 1
    for target in (BookTarget, target_factory()):
        lag = run_history(OTHER_PROJECT_LAG, target=target)
        assert lag.stats["page ok while another project's records were not applied"] >= 3
        assert lag.stats["page projection_pending"] == 2


# --------------------------------------------------------------------------------------- calibration


def latest_head_reader(**kwargs: Any) -> Any:
    """A known-wrong reader: every later page re-reads the project's latest head instead of the pinned
    through cursor, then reports the series' own through cursor and a token bound to it (so only the
    rows betray it)."""
    read = production_reader()
    through = kwargs.get("through_cursor")
    if through is None:
        return read(**kwargs)
    fresh = read(**{**kwargs, "through_cursor": None, "page_token": None})
    if fresh.status != "ok" or fresh.throughCursor is None:
        return read(**kwargs)
    head = fresh.throughCursor
    key, after = kwargs["token_key"], kwargs.get("after_cursor")
    project_hash = project_sha256(kwargs["project"])
    token = kwargs.get("page_token")
    offset = None if token is None else open_page_token(key, token, SeriesBinding.of(project_hash, after, through))
    rebound = None if offset is None else issue_page_token(key, SeriesBinding.of(project_hash, after, head), offset)
    result = read(**{**kwargs, "through_cursor": head, "page_token": rebound})
    next_token = result.page.nextToken
    if next_token is not None:
        next_offset = open_page_token(key, next_token, SeriesBinding.of(project_hash, after, head))
        next_token = issue_page_token(key, SeriesBinding.of(project_hash, after, through), next_offset)
    return result.model_copy(
        update={
            "throughCursor": through if result.status == "ok" else result.throughCursor,
            "page": PageWire(complete=result.page.complete, nextToken=next_token),
        }
    )


def test_calibration_latest_head_reader_is_rejected_on_the_pinned_history() -> None:
    with pytest.raises(AssertionError, match=r"oracle law \[(pinned-through|series-exact)\]"):
        run_history(TURNS_COMPLETE_BETWEEN_PAGES, reader=latest_head_reader, target=BookTarget)


def test_calibration_latest_head_reader_is_rejected_by_the_property(oracle_fixed_seed: int) -> None:
    with pytest.raises(AssertionError, match=r"oracle law \["):
        oracle_property(oracle_fixed_seed, reader=latest_head_reader, shrink=False, target=BookTarget)()


def test_calibration_production_passes_the_pinned_history() -> None:
    """The same history with the production reader is accepted (the rejection above is the reader's)."""
    driver: Driver = run_history(TURNS_COMPLETE_BETWEEN_PAGES, target=BookTarget)
    assert driver.stats["completed multi-page series"] == 1


# ----------------------------------------------------------------------------------- model isolation

#: Modules of the oracle that must not see production: the model (the expected rows) and the checker.
ISOLATED = ("model.py", "checker.py", "grammar.py")
FORBIDDEN_PREFIXES = ("throughline",)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("name", ISOLATED)
def test_model_imports_nothing_of_production(name: str) -> None:
    """The model, the checker and the grammar import nothing of throughline (statically)."""
    bad = {n for n in _imports(ORACLE_DIR / name) if n.split(".")[0] in FORBIDDEN_PREFIXES}
    assert not bad, f"{name} imports {sorted(bad)}"


def test_model_loads_no_production_module_at_run_time() -> None:
    """Importing the model and the checker loads no throughline module, directly or indirectly."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "import oracle.model, oracle.checker, oracle.grammar; "
        "print(sorted(m for m in sys.modules if m == 'throughline' or m.startswith('throughline.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(ORACLE_DIR.parent)], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
