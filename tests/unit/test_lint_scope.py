"""ruff and mypy see every Python file of the repository's code: the packages, bench/, and scripts/.

The Python scripts of scripts/ have no ``.py`` extension, so neither tool finds them by itself;
pyproject.toml names each one, and this fails when a new one is not named there.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _python_scripts() -> set[str]:
    found = set()
    for path in (ROOT / "scripts").iterdir():
        if path.is_file() and path.suffix != ".py":
            first = path.read_bytes().split(b"\n", 1)[0]
            if first.startswith(b"#!") and b"python" in first:
                found.add(f"scripts/{path.name}")
    return found


def test_every_python_script_is_linted_and_type_checked() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]
    scripts = _python_scripts()
    assert "scripts/oracle-mutants" in scripts  # the scan sees them
    assert "scripts/setup" not in scripts  # bash is not Python
    assert sorted(scripts - set(config["ruff"]["extend-include"])) == []
    assert sorted(scripts - set(config["mypy"]["files"])) == []


def test_mypy_checks_the_packages_and_bench() -> None:
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["mypy"]
    assert {"throughline", "producers", "projector", "reader", "schemas", "bench"} <= set(mypy["files"])
    assert not any("bench" in pattern for pattern in mypy.get("exclude", []))
    assert mypy["scripts_are_modules"] is True
