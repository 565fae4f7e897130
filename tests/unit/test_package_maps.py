"""Each package's opening docstring lists exactly its modules and subpackages: the map a newcomer reads.

The map is the docstring's paragraph that opens with a line holding "modules" and a colon (``Modules:``,
``Its modules, one concern each:``); when that line ends the paragraph, the list in the next paragraph
is the map. In it, a module is named as a lower-case ``name`` followed by a colon or a parenthesis (a bullet
``- ``name``: ...``, or inline ``name`` (...)), or as :mod:`~package.name`; other names there (classes,
functions inside the parentheses) are left alone. ``__main__`` and ``__init__`` need not be listed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The source folders and the import names they install as (pyproject's package-dir mapping).
ROOTS = {
    "throughline": "throughline",
    "producers": "throughline.producers",
    "projector": "throughline.projector",
    "reader": "throughline.reader",
    "schemas": "throughline.schemas",
}
_START = re.compile(r"(?i)\bmodules\b[^:\n]*:")
_ENTRY = re.compile(r"``([a-z_][a-z0-9_]*)``(?=:|\s+\()")
_MOD_REF = re.compile(r":mod:`~?([A-Za-z_][A-Za-z0-9_.]*)`")


def _packages() -> list[tuple[Path, str]]:
    found = []
    for folder, dotted in ROOTS.items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            relative = init.parent.relative_to(ROOT / folder).parts
            found.append((init.parent, ".".join((dotted, *relative))))
    return found


def _members(package: Path) -> set[str]:
    modules = {p.stem for p in package.glob("*.py") if not p.stem.startswith("__")}
    return modules | {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}


def _map_section(docstring: str) -> str | None:
    lines = docstring.splitlines()
    start = next((i for i, line in enumerate(lines) if _START.search(line)), None)
    if start is None:
        return None

    def paragraph(i: int) -> tuple[list[str], int]:
        j = i
        while j < len(lines) and lines[j].strip():
            j += 1
        return lines[i:j], j

    section, end = paragraph(start)
    if len(section) == 1 and section[0].rstrip().endswith(":"):  # the list follows, after a blank line
        while end < len(lines) and not lines[end].strip():
            end += 1
        section += paragraph(end)[0]
    return "\n".join(section)


def named_modules(docstring: str, dotted: str) -> tuple[set[str], set[str]] | None:
    """(the names the map lists, references to modules outside the package), or None without a map."""
    section = _map_section(docstring)
    if section is None:
        return None
    names = set(_ENTRY.findall(section))
    outside = set()
    for reference in _MOD_REF.findall(section):
        if reference.startswith(dotted + ".") and "." not in reference[len(dotted) + 1 :]:
            names.add(reference[len(dotted) + 1 :])
        elif "." not in reference:
            names.add(reference)
        else:
            outside.add(reference)
    return names, outside


PACKAGES = _packages()


def test_every_package_is_found() -> None:
    assert len(PACKAGES) >= 14
    assert {dotted for _, dotted in PACKAGES} >= set(ROOTS.values())


@pytest.mark.parametrize(("folder", "dotted"), PACKAGES, ids=[dotted for _, dotted in PACKAGES])
def test_package_docstring_lists_exactly_its_modules(folder: Path, dotted: str) -> None:
    docstring = ast.get_docstring(ast.parse((folder / "__init__.py").read_text("utf-8")))
    assert docstring, f"{dotted} has no docstring"
    found = named_modules(docstring, dotted)
    assert found is not None, f"{dotted}'s docstring has no map (a paragraph opening with 'modules ...:')"
    names, outside = found
    members = _members(folder)
    assert sorted(members - names) == [], f"{dotted}: modules missing from the docstring's map"
    assert sorted(names - members) == [], f"{dotted}: names in the docstring's map that are not its modules"
    assert sorted(outside) == [], f"{dotted}: the map refers to modules of another package"


def test_the_map_reader_sees_drift() -> None:
    docstring = """Summary.

    Its modules, one concern each:

    - ``alpha``: ``Alpha`` (``alpha.make``); ``beta``: the rest.
    - :mod:`~pkg.gamma` (the third) and ``delta`` (gone).

    Tables:

    - ``meta``: not a module.
    """
    names, outside = named_modules(docstring, "pkg") or (set(), set())
    assert names == {"alpha", "beta", "gamma", "delta"}
    assert outside == set()
    assert named_modules("Summary.\n\nNo map here.", "pkg") is None
    inline = named_modules("Summary.\n\nModules: ``one`` (``One``), :mod:`pkg.sub.two` (deep).", "pkg")
    assert inline == ({"one"}, {"pkg.sub.two"})
