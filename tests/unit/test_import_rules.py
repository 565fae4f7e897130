"""The import rules of the package map, read off every production module's source (``ast``; nothing is
imported or run):

- kafka-python only in ``throughline.log`` (the one Kafka edge) and the test harness ``throughline.testing``;
- duckdb and pyarrow only in ``throughline.projector.store`` (``projector/store``);
- fastapi, uvicorn and starlette only in ``throughline.serve``;
- the pure core ``throughline.core`` imports none of kafka, duckdb, fastavro, pydantic, pyarrow, the
  HTTP stack, nor any edge package of throughline (tests/unit/test_core_purity.py also checks, in a
  fresh interpreter, what importing the core loads transitively);
- commands apart from the engine: only ``throughline.commands`` and ``throughline.cli`` import argparse,
  call ``print`` or write to ``sys.stdout``, and no other module imports ``throughline.commands``. Two
  places are commands of their own and exempt: a module's ``if __name__ == "__main__":`` block (``python
  -m throughline.serve.app`` prints the OpenAPI document) and the test harness ``throughline.testing``
  (``python -m throughline.testing.kafka``, its own tool).

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


#: Where the command line lives: argument parsing, printing, exit codes (``command_violations``).
COMMANDS = ("throughline.commands", "throughline.cli")
#: Commands of their own that are not ``throughline`` subcommands (the test harness's tool).
OWN_COMMANDS = ("throughline.testing",)


def _is_main_guard(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":``: the module run as a script, which is a command."""
    test = node.test if isinstance(node, ast.If) else None
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


def _is_stdout(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "stdout"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def command_violations(module: str, path: Path, source: str | None = None) -> list[str]:
    """Every place where ``module`` does a command's job outside ``throughline.commands`` (argparse,
    ``print``, a write to ``sys.stdout``), or imports ``throughline.commands`` from the engine."""
    if _within(module, COMMANDS):
        return []
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found: set[tuple[int, str]] = set()
    for line, name in imported(module, path, source):
        if _within(name, ("throughline.commands",)):
            found.add((line, f"imports {name} (the engine never imports a command)"))
    if _within(module, OWN_COMMANDS):
        return [f"{where}:{line} {what}" for line, what in sorted(found)]
    tree = ast.parse(path.read_text("utf-8") if source is None else source)
    body = [node for node in tree.body if not _is_main_guard(node)]
    for node in (n for top in body for n in ast.walk(top)):
        if isinstance(node, ast.Import) and any(_within(a.name, ("argparse",)) for a in node.names):
            found.add((node.lineno, "imports argparse (parsing arguments is a command's job)"))
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module == "argparse":
            found.add((node.lineno, "imports argparse (parsing arguments is a command's job)"))
        elif isinstance(node, ast.ImportFrom) and node.module == "sys" and any(a.name == "stdout" for a in node.names):
            found.add((node.lineno, "imports sys.stdout (printing is a command's job)"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            found.add((node.lineno, "calls print (printing is a command's job)"))
        elif isinstance(node, ast.Attribute) and _is_stdout(node.value):
            found.add((node.lineno, f"uses sys.stdout.{node.attr} (printing is a command's job)"))
        elif isinstance(node, ast.Call) and any(_is_stdout(a) for a in [*node.args, *(k.value for k in node.keywords)]):
            found.add((node.lineno, "hands sys.stdout over (printing is a command's job)"))
    return [f"{where}:{line} {what}" for line, what in sorted(found)]


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


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_keeps_commands_apart_from_the_engine(module: str) -> None:
    bad = command_violations(module, MODULES[module])
    assert not bad, "\n".join(bad)


def test_the_commands_package_is_where_the_command_line_lives() -> None:
    commands = [m for m in MODULES if _within(m, ("throughline.commands",))]
    assert {"throughline.commands.read", "throughline.commands.serve", "throughline.commands.options"} <= set(commands)
    # The rule is not vacuous: the commands do parse and print.
    sources = "\n".join(MODULES[m].read_text("utf-8") for m in commands)
    assert "import argparse" in sources and "print(" in sources


@pytest.mark.parametrize(
    ("module", "file", "source", "what"),
    [
        ("throughline.projector.runner", "projector/runner.py", "import argparse\n", "imports argparse"),
        (
            "throughline.reader.page",
            "reader/page.py",
            "def f():\n    from argparse import Namespace\n",
            "imports argparse",
        ),
        ("throughline.serve.service", "throughline/serve/service.py", "print('ready')\n", "calls print"),
        (
            "throughline.producers.ingest.run",
            "producers/ingest/run.py",
            "import sys\ndef f():\n    sys.stdout.write('x')\n",
            "uses sys.stdout.write",
        ),
        ("throughline.settings", "throughline/settings.py", "from sys import stdout\n", "imports sys.stdout"),
        ("throughline.producers.ingest.dry", "producers/ingest/dry.py", "import sys\nf(sys.stdout)\n", "hands"),
        ("throughline.reader.page", "reader/page.py", "from throughline.commands import options\n", "never imports"),
        ("throughline.projector.replay", "projector/replay.py", "from ..commands.project import x\n", "never imports"),
        ("throughline.testing.hosts", "throughline/testing/hosts.py", "import throughline.commands.read\n", "never"),
    ],
)
def test_a_command_outside_the_commands_is_reported(module: str, file: str, source: str, what: str) -> None:
    bad = command_violations(module, ROOT / file, source)
    assert bad and all(what in line for line in bad), bad


def test_commands_and_scripts_may_print() -> None:
    assert command_violations("throughline.commands.read", ROOT / "throughline/commands/read.py", "print(1)\n") == []
    assert command_violations("throughline.cli", ROOT / "throughline/cli.py", "import argparse\n") == []
    script = "import sys\nif __name__ == '__main__':\n    sys.stdout.write('x')\n"
    assert command_violations("throughline.serve.app", ROOT / "throughline/serve/app.py", script) == []
    harness = "import argparse\nprint('x')\n"
    assert command_violations("throughline.testing.kafka.cli", ROOT / "throughline/testing/kafka/cli.py", harness) == []
    # Looking at sys.stdout is not writing to it (uvicorn's handlers are moved to stderr so).
    compare = "import sys\ndef f(h):\n    return h.stream is sys.stdout\n"
    assert command_violations("throughline.serve.security", ROOT / "throughline/serve/security.py", compare) == []
