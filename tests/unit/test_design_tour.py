"""The tour at the top of docs/design.md leads to code that exists.

A newcomer follows five behaviours (a poison record is quarantined, a page token is verified, a read
waits for the projector, a transcript line becomes a turn, a member forwards a read) from the tour to
the one or two modules that do them. Modules and functions get renamed; this test fails when a
``file::name`` the tour gives no longer names a module-level function or class, or a method of a class
in that file, so the tour is corrected with the rename.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
REF = re.compile(r"`([\w/]+\.py)::([\w.]+)`")
BEHAVIOURS = (
    "A poison record is quarantined",
    "A page token is verified",
    "A read waits for the projector",
    "A transcript line becomes a turn",
    "A member forwards a read",
)


def tour() -> str:
    """The tour's section of docs/design.md."""
    text = DESIGN.read_text("utf-8")
    start = text.index("## A tour: five behaviours")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def defines(path: Path, dotted: str) -> bool:
    """Whether ``path`` defines ``dotted``: a top-level function or class, or ``Class.method``."""
    scope: list[ast.stmt] = ast.parse(path.read_text("utf-8")).body
    for name in dotted.split("."):
        found = [
            node
            for node in scope
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name
        ]
        if not found:
            return False
        node = found[0]
        scope = node.body if isinstance(node, ast.ClassDef) else []
    return True


def test_the_tour_covers_the_five_behaviours_in_one_or_two_modules_each() -> None:
    rows = {line.split("|")[1]: line for line in tour().splitlines() if line.startswith("| **")}
    for behaviour in BEHAVIOURS:
        row = next((line for head, line in rows.items() if behaviour in head), None)
        assert row is not None, behaviour
        assert REF.search(row), behaviour
    assert len(rows) == len(BEHAVIOURS)


def test_every_name_in_the_tour_exists() -> None:
    refs = REF.findall(tour())
    assert len(refs) >= 10
    missing = [f"{file}::{name}" for file, name in refs if not (ROOT / file).is_file()]
    assert missing == []
    undefined = [f"{file}::{name}" for file, name in refs if not defines(ROOT / file, name)]
    assert undefined == []


def test_the_check_catches_a_renamed_function() -> None:
    page = ROOT / "reader" / "page.py"
    assert defines(page, "read_page")
    assert not defines(page, "read_the_page")
    assert defines(ROOT / "projector" / "store" / "transaction.py", "ApplyTransaction.fold")
    assert not defines(ROOT / "projector" / "store" / "transaction.py", "ApplyTransaction.unfold")
