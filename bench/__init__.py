"""throughline's benchmark suite: speed goals proven as ratios measured in one run on one machine.

Run from the repository root: ``.venv/bin/python -m bench`` (``--help`` for sizes). It writes
``docs/benchmarks.md``. Nothing here is an installed package and no test asserts a speed.
"""
