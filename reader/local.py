"""Pages read in this process from the projection file and the Kafka log (``open_page_reader``).

``throughline read`` and ``throughline observe`` read through it when no ``--url`` names a running
``serve``; the Observer takes a ``LocalPageReader`` as its ``PageReader``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from throughline.core.ports import LogView
from throughline.reader.page import read_page
from throughline.reader.request import ReadRequest
from throughline.reader.token_key import resolve_token_key
from throughline.reader.wire import ObserverRead
from throughline.settings import Settings


@dataclass(frozen=True, slots=True)
class LocalPageReader:
    """Pages read in this process from the projection file and the Kafka log (``open_page_reader``).

    ``read(request)`` reads the page a ``ReadRequest`` names; a call with its keywords is the Observer's
    ``PageReader``. The projection is opened read-only for each page and closed after it, so a projector
    may take the file between pages (a busy file is a retriable error the Observer backs off from).
    """

    settings: Settings
    log: LogView
    token_key: bytes
    wait_timeout: float
    body_limit: int

    def read(self, request: ReadRequest) -> ObserverRead:
        """The page ``request`` names, from a fresh read-only open of the projection."""
        from throughline.projector.store import DuckProjection

        projection = DuckProjection.open(self.settings.db, read_only=True, topic=self.settings.topic)
        try:
            return read_page(
                request,
                projection=projection,
                log=self.log,
                token_key=self.token_key,
                wait_timeout=self.wait_timeout,
                body_limit=self.body_limit,
            )
        finally:
            projection.close()

    def __call__(self, **request: Any) -> ObserverRead:
        """The Observer's ``PageReader`` call (``project``, ``after_cursor``, ... as keywords)."""
        return self.read(ReadRequest(**request))


@contextlib.contextmanager
def open_page_reader(
    settings: Settings, *, token_key_file: str | None, wait_timeout: float, body_limit: int
) -> Iterator[LocalPageReader]:
    """A ``LocalPageReader`` over the projection file and the Kafka log named by ``settings``."""
    from throughline.log import KafkaLog
    from throughline.projector.exceptions import ProjectionMissingError

    kafka_config = settings.kafka_config()  # a settings mistake is reported before anything else
    if not os.path.exists(settings.db):
        # Say what is missing before the key beside it is looked for (or created).
        raise ProjectionMissingError(
            f"no projection at {settings.db}: run `throughline project` or `throughline replay` first"
        )
    token_key = resolve_token_key(db_path=settings.db, key_file=token_key_file)
    log = KafkaLog(settings.require_bootstrap(), settings.topic, kafka_config=kafka_config)
    try:
        yield LocalPageReader(settings, log, token_key, wait_timeout, body_limit)
    finally:
        log.close()
