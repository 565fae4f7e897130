"""The pure core loads neither Kafka nor DuckDB (nor anything that does), even transitively.

What each core module imports itself is one of the import rules (tests/unit/test_import_rules.py).
"""

from __future__ import annotations

import subprocess
import sys

from test_import_rules import CORE_FORBIDDEN as FORBIDDEN


def test_importing_the_whole_core_in_a_fresh_interpreter_loads_no_edge() -> None:
    """What the modules import *transitively*: the import rules see only each module's own lines."""
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
