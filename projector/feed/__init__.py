"""Where the projector's batches come from: a ``Fetcher`` polls the topic and prepares each poll.

Two feeds run the same ``Fetcher`` and answer the same ``Feed`` contract:

- ``LocalFeed``: on the caller's thread. The projector then fetches, decodes, checks, folds and writes
  one poll after the other on one core.
- ``WorkerFeed`` (the default): in a child process (``python -m throughline.projector.feed``), one
  poll ahead of the main process, which folds and writes; so the projector uses two cores.

Modules: ``poller`` (``ProjectorOptions``, ``FeedSpec``, the ``Feed`` contract, ``Fetcher``,
``LocalFeed``), ``worker`` (the worker process: its spawn, ``WorkerFeed``, ``worker_main``), ``frames``
(the frames the worker writes to the parent on a pipe). None imports DuckDB or Arrow, so the worker
starts quickly.
"""

from __future__ import annotations

from throughline.projector.exceptions import FetchWorkerError
from throughline.projector.feed.poller import (
    DEFAULT_MAX_POLL_RECORDS,
    Feed,
    FeedSpec,
    Fetcher,
    LocalFeed,
    ProjectorOptions,
    open_consumer,
)
from throughline.projector.feed.worker import WorkerFeed, WorkerProcess, open_feed, spawn_worker, spawn_worker_ahead

__all__ = [
    "DEFAULT_MAX_POLL_RECORDS",
    "Feed",
    "FeedSpec",
    "FetchWorkerError",
    "Fetcher",
    "LocalFeed",
    "ProjectorOptions",
    "WorkerFeed",
    "WorkerProcess",
    "open_consumer",
    "open_feed",
    "spawn_worker",
    "spawn_worker_ahead",
]
