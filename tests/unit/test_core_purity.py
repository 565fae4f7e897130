"""The pure core imports neither Kafka nor DuckDB (nor anything that does)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "throughline" / "core"
FORBIDDEN = ("kafka", "duckdb", "pyarrow", "fastapi", "uvicorn", "throughline.projector", "throughline.log")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_core_module_imports_no_edge(path: Path) -> None:
    bad = {n for n in _imports(path) if any(n == f or n.startswith(f + ".") for f in FORBIDDEN)}
    assert not bad, f"{path.name} imports {sorted(bad)}"


def test_core_has_modules() -> None:
    assert len(list(CORE.glob("*.py"))) >= 8
