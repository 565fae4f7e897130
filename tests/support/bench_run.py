"""Running a benchmark module the way a person does (``python -m bench ...`` from the repository's root),
for the bench smoke tests: the bench package lives beside the tests, not in the installed package."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_bench(
    module_and_args: Sequence[str], *, bootstrap: str | None = None, timeout: float = 300.0
) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS...`` in the repository, its output captured as text; with ``bootstrap``,
    the bench's broker is that one (``THROUGHLINE_TEST_BOOTSTRAP_SERVERS``). The caller checks its exit
    code (``failure`` is the message to show when it is not the one expected)."""
    env = None if bootstrap is None else dict(os.environ, THROUGHLINE_TEST_BOOTSTRAP_SERVERS=bootstrap)
    return subprocess.run(
        [sys.executable, "-m", *module_and_args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def failure(proc: subprocess.CompletedProcess[str]) -> str:
    """The ends of a bench's output, for an assertion's message."""
    return proc.stdout[-3000:] + proc.stderr[-3000:]
