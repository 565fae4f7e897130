"""The import rules of the package map, read off every production module's source (``ast``; nothing is
imported or run):

- kafka-python only in ``throughline.log`` (the one Kafka edge) and the test harness ``throughline.testing``;
- duckdb and pyarrow only in ``throughline.projector.store`` (``projector/store``);
- fastapi, uvicorn and starlette only in ``throughline.serve``;
- the pure core ``throughline.core`` imports none of kafka, duckdb, fastavro, pydantic, pyarrow, the
  HTTP stack, nor any edge package of throughline (tests/unit/test_core_purity.py also checks, in a
  fresh interpreter, what importing the core loads transitively).

Every import counts: at module level, inside functions and under ``TYPE_CHECKING``, absolute and
relative. The production modules are the folders pyproject installs (``tool.setuptools.package-dir``),
named by the import names they install under.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class Rule:
    """Modules named in ``imports`` (and their submodules) may be imported only by ``only_in``."""

    name: str
    imports: tuple[str, ...]
    only_in: tuple[str, ...]


RULES = (
    Rule("one Kafka edge", ("kafka",), ("throughline.log", "throughline.testing")),
    Rule("DuckDB behind the store", ("duckdb", "pyarrow"), ("throughline.projector.store",)),
    Rule("HTTP behind serve", ("fastapi", "uvicorn", "starlette"), ("throughline.serve",)),
)
#: What the pure core never imports (third-party edges and throughline's own edge packages).
CORE = "throughline.core"
CORE_FORBIDDEN = (
    "kafka",
    "duckdb",
    "fastavro",
    "pydantic",
    "pyarrow",
    "fastapi",
    "uvicorn",
    "starlette",
    "throughline.log",
    "throughline.projector",
    "throughline.reader",
    "throughline.schemas",
    "throughline.serve",
    "throughline.producers",
    "throughline.testing",
)


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def production_modules() -> dict[str, Path]:
    """Import name -> source file of every production module (the folders pyproject installs)."""
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"]["package-dir"]
    folders = {(ROOT / folder).resolve(): name for name, folder in package_dir.items()}
    modules: dict[str, Path] = {}
    for folder, package in folders.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def imported(module: str, path: Path, source: str | None = None) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import statement of ``module`` (relative ones resolved)."""
    tree = ast.parse(path.read_text("utf-8") if source is None else source)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield node.lineno, target
            # ``from throughline import log`` imports the submodule ``throughline.log``.
            for alias in node.names:
                yield node.lineno, f"{target}.{alias.name}"


def violations(module: str, path: Path, source: str | None = None) -> list[str]:
    """Every import of ``module`` that breaks a rule, as ``file:line imports X (rule)``."""
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found: dict[tuple[int, str], str] = {}  # one line per statement and rule
    for line, name in imported(module, path, source):
        for rule in RULES:
            if _within(name, rule.imports) and not _within(module, rule.only_in):
                found.setdefault(
                    (line, rule.name), f"{where}:{line} imports {name} ({rule.name}: only {', '.join(rule.only_in)})"
                )
        if _within(module, (CORE,)) and _within(name, CORE_FORBIDDEN):
            found.setdefault((line, "core"), f"{where}:{line} imports {name} (the core stays pure)")
    return [found[k] for k in sorted(found)]


MODULES = production_modules()


def test_the_scan_sees_every_production_package() -> None:
    assert len(MODULES) > 60
    for name in (
        "throughline.log.clients",
        "throughline.projector.feed.poller",
        "throughline.core.memory",
        "throughline.serve.app",
        "throughline.reader.page",
        "throughline.producers.producer",
        "throughline.schemas.codec",
        "throughline.testing.pytest_plugin",
    ):
        assert name in MODULES, name
    assert MODULES["throughline.projector.runner"] == ROOT / "projector" / "runner.py"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_keeps_the_import_rules(module: str) -> None:
    bad = violations(module, MODULES[module])
    assert not bad, "\n".join(bad)


def test_the_rules_hold_where_they_are_meant_to() -> None:
    # Each rule names packages that exist and that do import what they are allowed to (a rule whose
    # allowed side imports nothing would be a stale rule).
    for rule in RULES:
        users = {m for m in MODULES for _, n in imported(m, MODULES[m]) if _within(n, rule.imports)}
        assert users, rule
        assert all(_within(m, rule.only_in) for m in users), rule


@pytest.mark.parametrize(
    ("module", "file", "source", "rule"),
    [
        ("throughline.projector.runner", "projector/runner.py", "import kafka\n", "one Kafka edge"),
        (
            "throughline.reader.page",
            "reader/page.py",
            "def f():\n    from kafka.errors import KafkaError\n",
            "one Kafka edge",
        ),
        (
            "throughline.producers.producer",
            "producers/producer.py",
            "from kafka import KafkaProducer as P\n",
            "one Kafka edge",
        ),
        ("throughline.commands.status", "throughline/commands/status.py", "import duckdb\n", "DuckDB behind the store"),
        (
            "throughline.commands.read",
            "throughline/commands/read.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pyarrow as pa\n",
            "DuckDB behind the store",
        ),
        (
            "throughline.reader.wire",
            "reader/wire.py",
            "from starlette.responses import Response\n",
            "HTTP behind serve",
        ),
        ("throughline.core.ports", "throughline/core/ports.py", "import fastavro\n", "the core stays pure"),
        ("throughline.core.ports", "throughline/core/ports.py", "from throughline import log\n", "the core stays pure"),
        (
            "throughline.core.ports",
            "throughline/core/ports.py",
            "from ..projector import store\n",
            "the core stays pure",
        ),
        ("throughline.core.ports", "throughline/core/ports.py", "import pydantic.dataclasses\n", "the core stays pure"),
    ],
)
def test_a_broken_rule_is_reported(module: str, file: str, source: str, rule: str) -> None:
    bad = violations(module, ROOT / file, source)
    assert bad and all(rule in line for line in bad), bad


def test_allowed_imports_are_not_reported() -> None:
    assert violations("throughline.log.view", ROOT / "throughline/log/view.py", "import kafka\n") == []
    assert violations("throughline.projector.store.view", ROOT / "projector/store/view.py", "import duckdb\n") == []
    assert violations("throughline.serve.app", ROOT / "throughline/serve/app.py", "from fastapi import FastAPI\n") == []
    assert violations("throughline.core.fold", ROOT / "throughline/core/fold.py", "from . import cursor\n") == []
    # A module merely named like an edge is not the edge.
    assert violations("throughline.reader.page", ROOT / "reader/page.py", "import kafka_notes\n") == []
