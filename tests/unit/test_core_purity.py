"""The pure core imports neither Kafka nor DuckDB (nor anything that does)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "throughline" / "core"
FORBIDDEN = (
    "kafka", "duckdb", "fastavro", "pydantic", "pyarrow", "fastapi", "uvicorn", "starlette",
    "throughline.projector", "throughline.log", "throughline.schemas",
)


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


def test_importing_the_whole_core_in_a_fresh_interpreter_loads_no_edge() -> None:
    """What the modules import *transitively*: the AST check above sees only each module's own lines."""
    code = (
        "import importlib, pkgutil, sys\n"
        "import throughline.core as core\n"
        "for m in pkgutil.iter_modules(core.__path__): importlib.import_module('throughline.core.' + m.name)\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded = out.stdout.split()
    assert "throughline.core.cursor" in loaded  # it did import the core
    bad = sorted(n for n in loaded if any(n == f or n.startswith(f + ".") for f in FORBIDDEN))
    assert not bad, f"importing throughline.core loads {bad}"
