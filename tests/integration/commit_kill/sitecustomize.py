"""Test-only crash injection: SIGKILL the projector around the commit of a batch holding a repair record.

On the ``PYTHONPATH`` of a ``throughline`` process started with ``THROUGHLINE_TEST_KILL_AT_REPAIR=WHEN:FILE``
(``WHEN`` is ``before`` or ``after``), the first batch transaction holding a repair record that manages
to remove ``FILE`` kills its own process: ``before``, once the batch is folded and written but before
``COMMIT``; ``after``, right after ``COMMIT``, before the in-memory state is published. The removal is
the claim, so exactly one batch of the whole run is hit. Nothing of production is changed: a method
is wrapped at start-up (tests/integration/test_repair_workflow.py).
"""

from __future__ import annotations

import os
import signal

_spec = os.environ.get("THROUGHLINE_TEST_KILL_AT_REPAIR")
if _spec:
    _when, _, _marker = _spec.partition(":")
    import throughline.projector.store as _store
    from throughline.projector.prepare import RepairItem

    _real = _store.DuckProjection._transact

    def _has_repair(work):
        return any(type(it) is RepairItem for _, items in work.batches for it in items)

    def _claim():
        try:
            os.unlink(_marker)
        except FileNotFoundError:
            return False
        return True

    def _transact(self, cur, work):
        if _when == "before" and _has_repair(work):
            real_run = work.run

            def run():
                summary = real_run()
                if _claim():
                    os.kill(os.getpid(), signal.SIGKILL)
                return summary

            work.run = run
        summary = _real(self, cur, work)
        if _when == "after" and _has_repair(work) and _claim():
            os.kill(os.getpid(), signal.SIGKILL)
        return summary

    _store.DuckProjection._transact = _transact
