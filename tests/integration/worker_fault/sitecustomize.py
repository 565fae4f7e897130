"""Test-only fault injection: the projector's fetch worker raises once (``projector_env.worker_fault_env``).

On the ``PYTHONPATH`` of a ``throughline`` process started with ``THROUGHLINE_TEST_WORKER_FAULT=FILE``,
Python imports this module at start-up (as ``sitecustomize``) in that process and in every process it
starts, the fetch worker among them. The first ``prepare_batch`` call that manages to remove ``FILE``
raises ``RuntimeError(INJECTED)``: the removal is the claim, so exactly one call of the whole run fails
and the restarted worker runs normally. With the worker on, only the worker calls ``prepare_batch``.
Nothing of production is changed: the function is wrapped before anything imports it by name.
"""

from __future__ import annotations

import os

INJECTED = "injected fetch worker failure"  # projector_env.WORKER_FAULT

_marker = os.environ.get("THROUGHLINE_TEST_WORKER_FAULT")
if _marker:
    import throughline.projector.prepare as _prepare

    _real = _prepare.prepare_batch

    def _failing_once(*args, **kwargs):
        try:
            os.unlink(_marker)
        except FileNotFoundError:
            return _real(*args, **kwargs)
        raise RuntimeError(INJECTED)

    _prepare.prepare_batch = _failing_once
