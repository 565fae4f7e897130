"""Every mutant of scripts/oracle-mutants finds its place in today's source, exactly once.

The script runs in CI in full (minutes); this checks, in a fraction of a second, what a refactor breaks
first: the ``# mutant-anchor: NAME`` comment that marks the statement a mutant changes, and the code the
mutant replaces inside that statement.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("throughline", "producers", "projector", "reader", "schemas")


def _load_script() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("oracle_mutants", str(ROOT / "scripts" / "oracle-mutants"))
    spec = importlib.util.spec_from_loader("oracle_mutants", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["oracle_mutants"] = module  # dataclasses look their module up while the class is built
    try:
        loader.exec_module(module)
    finally:
        del sys.modules["oracle_mutants"]
    return module


SCRIPT = _load_script()


@pytest.mark.parametrize("mutant", SCRIPT.MUTANTS, ids=lambda m: m.name)
def test_mutant_anchor_resolves_once(mutant: object) -> None:
    patch = SCRIPT.resolve(mutant)  # AnchorError (naming the mutant and file) when the anchor is lost
    source = (ROOT / patch.mutant.path).read_text("utf-8")
    assert source[patch.start : patch.end] == patch.original
    patched = patch.apply(source)
    assert patched != source
    ast.parse(patched)
    assert patched.count(patch.block[1]) == 1  # what the in-place run's restore looks for


def test_every_marker_names_a_mutant() -> None:
    names = {m.name for m in SCRIPT.MUTANTS}
    assert len(names) == len(SCRIPT.MUTANTS)
    found: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text("utf-8")
            if "mutant-anchor" in text:
                for name, line in SCRIPT.markers(text):
                    found.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{line}")
    assert {name: places for name, places in found.items() if name not in names} == {}
    assert {m.name: found.get(m.name, []) for m in SCRIPT.MUTANTS if len(found.get(m.name, [])) != 1} == {}


def test_a_lost_anchor_is_an_error_naming_mutant_and_file(tmp_path: Path) -> None:
    mutant = SCRIPT.MUTANTS[0]
    source = (ROOT / mutant.path).read_text("utf-8")
    target = tmp_path / mutant.path
    target.parent.mkdir(parents=True)
    assert source.count(mutant.old) == 1
    for broken in (
        source.replace(f"mutant-anchor: {mutant.name}", "moved"),  # the marker is gone
        source + f"\n_ = 1  # mutant-anchor: {mutant.name}\n",  # a second marker
        source.replace(mutant.old, "if through is not None:"),  # the marked statement changed
    ):
        target.write_text(broken, "utf-8")
        with pytest.raises(SCRIPT.AnchorError, match=f"mutant {mutant.name}: {mutant.path}: "):
            SCRIPT.resolve(mutant, tmp_path)


def test_a_reindented_and_rewrapped_statement_keeps_its_anchor() -> None:
    mutant = SCRIPT.Mutant("demo", "x.py", "max(a, b if b else -1) + 1", "a + 1", "a demo")
    source = (
        "def f(a, b, end):\n"
        "    if a:\n"
        "        need = (\n"
        "            end if a is None else max(\n"
        "                a,\n"
        "                b if b else -1,\n"
        "            ) + 1\n"
        "        )  # mutant-anchor: demo\n"
        "        return need\n"
        "    need = max(a, b if b else -1) + 1\n"
    )
    patch = SCRIPT.locate(mutant, source)
    assert patch.function == "f"
    assert "end if a is None else a + 1\n        )  # mutant-anchor: demo" in patch.apply(source)
    assert patch.apply(source).endswith("    need = max(a, b if b else -1) + 1\n")  # the unmarked one stays
