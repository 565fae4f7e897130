"""Seeds of the read-series oracle: a fixed one, and one drawn per run (or replayed from the environment).

``THROUGHLINE_ORACLE_SEED=N`` replays the unseeded run with seed ``N``; ``THROUGHLINE_ORACLE_BLOB``
replays one shrunk counterexample exactly (the ``@reproduce_failure`` blob Hypothesis prints). The seeds
of every run are printed in the terminal summary, pass or fail.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

import pytest

FIXED_SEED = 20260715  # the date the read contract was decided (docs/spec.md#system)
ENV_SEED = "THROUGHLINE_ORACLE_SEED"
ENV_BLOB = "THROUGHLINE_ORACLE_BLOB"
ENV_EXAMPLES = "THROUGHLINE_ORACLE_EXAMPLES"
ENV_TARGET = "THROUGHLINE_ORACLE_TARGET"

_SEEDS_KEY = pytest.StashKey[dict[str, int]]()


def _drawn_seed() -> int:
    text = os.environ.get(ENV_SEED, "").strip()
    return int(text) if text else secrets.randbelow(2**32)


_RUN_SEED = _drawn_seed()


@pytest.fixture(scope="session")
def oracle_seed(request: pytest.FixtureRequest) -> int:
    """The seed of this run's unseeded oracle property (``THROUGHLINE_ORACLE_SEED`` when set)."""
    request.config.stash.setdefault(_SEEDS_KEY, {})["unseeded"] = _RUN_SEED
    return _RUN_SEED


@pytest.fixture(scope="session")
def oracle_fixed_seed(request: pytest.FixtureRequest) -> int:
    """The fixed seed CI runs beside the unseeded one."""
    request.config.stash.setdefault(_SEEDS_KEY, {})["fixed"] = FIXED_SEED
    return FIXED_SEED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    seeds = config.stash.get(_SEEDS_KEY, {})
    if not seeds:
        return
    terminalreporter.section("throughline read-series oracle", sep="-")
    if "fixed" in seeds:
        terminalreporter.write_line(f"fixed seed {seeds['fixed']}")
    if "unseeded" in seeds:
        terminalreporter.write_line(
            f"unseeded run seed {seeds['unseeded']} (replay: {ENV_SEED}={seeds['unseeded']} "
            "pytest tests/oracle -k unseeded)"
        )
