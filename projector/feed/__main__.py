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

from throughline.projector.feed.worker import worker_main

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the parent's to handle; it stops us
    sys.exit(worker_main(int(sys.argv[1]), int(sys.argv[2])))
