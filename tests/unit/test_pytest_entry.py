"""The pytest11 entry point loads throughline's plugin only where the test extra is installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Runs pytest --fixtures on a folder of the user's own (no conftest); "block" hides the extra's marker.
RUNNER = """
import sys
if sys.argv[1] == "block":
    sys.modules["testcontainers"] = None  # as if the extra were not installed: find_spec answers None
import pytest
sys.exit(pytest.main(["--fixtures", "-q", "-p", "no:cacheprovider", sys.argv[2]]))
"""


def _fixtures(tmp_path: Path, *, block: bool, env: dict[str, str] | None = None) -> str:
    (tmp_path / "test_users_own.py").write_text("def test_nothing():\n    assert True\n")
    run_env = {k: v for k, v in os.environ.items() if k != "THROUGHLINE_PYTEST_PLUGIN"} | (env or {})
    out = subprocess.run(
        [sys.executable, "-c", RUNNER, "block" if block else "allow", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=run_env,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out.stdout


def test_with_the_test_extra_a_users_suite_gets_the_fixtures(tmp_path: Path) -> None:
    listed = _fixtures(tmp_path, block=False)
    assert "kafka_broker" in listed and "throughline_container" in listed


def test_without_the_test_extra_the_plugin_stays_out_of_a_users_pytest(tmp_path: Path) -> None:
    listed = _fixtures(tmp_path, block=True)
    assert "kafka_broker" not in listed and "throughline_container" not in listed


@pytest.mark.parametrize("value", ["0", "off"])
def test_throughline_pytest_plugin_0_turns_it_off(tmp_path: Path, value: str) -> None:
    listed = _fixtures(tmp_path, block=False, env={"THROUGHLINE_PYTEST_PLUGIN": value})
    assert "kafka_broker" not in listed


def test_the_entry_point_imports_nothing_of_throughline_when_off(tmp_path: Path) -> None:
    code = (
        "import sys, os; os.environ['THROUGHLINE_PYTEST_PLUGIN'] = '0'; import throughline.testing.pytest_entry; "
        "print(sorted(m for m in sys.modules if m.startswith(('kafka', 'duckdb', 'throughline.log'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
