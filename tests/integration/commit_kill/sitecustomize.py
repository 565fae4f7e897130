"""Test-only crash injection: SIGKILL the projector around the commit of a batch holding a repair record.

On the ``PYTHONPATH`` of a ``throughline`` process started with ``THROUGHLINE_TEST_KILL_AT_REPAIR=WHEN:FILE``
(``WHEN`` is ``before`` or ``after``), the first batch transaction holding a repair record that manages
to remove ``FILE`` kills its own process: ``before``, once the batch is folded and written but before
``COMMIT``; ``after``, right after ``COMMIT``, before the in-memory state is published. The removal is
the claim, so exactly one batch of the whole run is hit. Nothing of production is changed: two methods
are wrapped at start-up (tests/integration/test_repair_workflow.py).
"""

from __future__ import annotations

import os
import signal

_spec = os.environ.get("THROUGHLINE_TEST_KILL_AT_REPAIR")
if _spec:
    _when, _, _marker = _spec.partition(":")
    from throughline.projector.prepare import RepairItem
    from throughline.projector.store.transaction import ApplyTransaction

    _real_execute = ApplyTransaction.execute
    _real_fold = ApplyTransaction.fold_and_write

    def _has_repair(txn):
        return any(type(it) is RepairItem for _, items in txn.batches for it in items)

    def _claim():
        try:
            os.unlink(_marker)
        except FileNotFoundError:
            return False
        return True

    def _fold_and_write(self):
        summary = _real_fold(self)
        if _when == "before" and _has_repair(self) and _claim():
            os.kill(os.getpid(), signal.SIGKILL)
        return summary

    def _execute(self, before_commit=None):
        summary = _real_execute(self, before_commit)
        if _when == "after" and _has_repair(self) and _claim():
            os.kill(os.getpid(), signal.SIGKILL)
        return summary

    ApplyTransaction.fold_and_write = _fold_and_write
    ApplyTransaction.execute = _execute
