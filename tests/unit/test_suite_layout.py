"""The suite's own layout: pytest imports test modules by basename (the tiers have no ``__init__.py``), so
two test files of one name in two tiers stop the whole run at collection."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_basename() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py") if "fixtures" not in p.parts)
    assert [n for n, count in names.items() if count > 1] == []
