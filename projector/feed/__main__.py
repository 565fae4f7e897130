"""The fetch worker process: ``python -m throughline.projector.feed FD PARENT_PID``.

Only the entry point; the worker is ``throughline.projector.feed.worker.worker_main``. Run with ``-m``, a
module is ``__main__``, and a class defined in it pickles as ``__main__.X``, which the parent cannot
load: an error the worker sent it reached the parent as an ``AttributeError`` instead of the retriable
``fetch_worker_failed``. So this module defines nothing, and everything the worker sends (frames of
``PreparedBatch``, ``FetchWorkerError``, the log's ``LogError``s) comes from importable modules.
"""

from __future__ import annotations

import signal
import sys

from throughline.projector.feed.worker import worker_main  # mutant-anchor: worker-error-in-main

if __name__ == "__main__":
    # A Ctrl-C, and a SIGTERM sent to the whole process group (``timeout``, systemd's default
    # ``KillMode=control-group``), are the parent's to handle: it stops us with SIGKILL when it is done.
    # Dying first would make a stopping projector warn, and start a new worker, on its way out.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(worker_main(int(sys.argv[1]), int(sys.argv[2])))
