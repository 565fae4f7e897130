"""Counting for the reliability suite (issue: reliability and security).

Every test in this folder records what it tried and what it found (cases, kills, restarts, lost,
doubled, unhandled) with ``rel_support.record``. At the end of the session the counts are printed
in a ``throughline reliability`` section of the pytest summary, and written as JSON to the file named
by ``THROUGHLINE_RELIABILITY_REPORT`` when it is set (``scripts/reliability-run`` turns that file into
``docs/reliability.md``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import rel_support


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get(rel_support.ENV_REPORT)
    if not target or not rel_support.REPORT:
        return
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    document: dict[str, Any] = {"items": rel_support.REPORT, "exitstatus": int(exitstatus)}
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if not rel_support.REPORT:
        return
    terminalreporter.section("throughline reliability", sep="-")
    for line in rel_support.summary_lines():
        terminalreporter.write_line(line)
