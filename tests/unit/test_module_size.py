"""No production module is over 600 lines (the house rule: one concern per module; a longer one is asking
to be split). The harness's own modules are held to the same bound in ``test_harness_layout``."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("throughline", "producers", "projector", "reader", "schemas")
MAX_LINES = 600


def test_no_production_module_is_over_600_lines() -> None:
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text("utf-8").splitlines())
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
    }
    assert len(sizes) > 100  # the tree was found
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
