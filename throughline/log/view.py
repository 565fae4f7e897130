"""``KafkaLog``: the reader's and projector's view of the log right now (the ``LogView`` port).

"The log at the time of the call" is a partition's end offset, so ``end_offset`` asks the broker on
every call (a ListOffsets request, bounded in time) and never answers from a cache; calls that overlap
share a request sent after each of them began (``NextAnswer``). One long-lived
``KafkaConsumer`` without a group serves those requests: it joins no group, commits nothing and
fetches no records. kafka-python consumers are not thread-safe, so every use goes through a lock.

The end offset is the one a ``read_committed`` consumer sees (the last stable offset): the projector
reads committed records only, so a record of a transaction still open is not yet in the log it can
apply, and a read must not wait for it (it may yet be aborted). Without transactional producers it is
the high watermark.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING

from kafka import TopicPartition

from throughline.log import clients
from throughline.log.config import KafkaClientConfig
from throughline.log.consumer import RETRY_BACKOFF_MS, prompt_metadata
from throughline.log.exceptions import (
    LogClosedError,
    LogError,
    OtherKafkaError,
    TopicMissingError,
    UnknownPartitionError,
)
from throughline.log.next_answer import NextAnswer
from throughline.log.placement import TopicClient
from throughline.log.topic import bootstrap_list
from throughline.log.translate import KafkaErrors

if TYPE_CHECKING:
    from throughline.core.ports import LogView

DEFAULT_LOG_TIMEOUT = 10.0
#: How often a caller queued for the consumer looks whether the view was closed meanwhile.
_CLOSED_CHECK_S = 0.1


class KafkaLog(TopicClient):
    """The partitions and end offsets of the topic of completed turns (implements ``LogView``).

    The partition count is read once when the view opens; a topic's partition count must never change
    (see ``throughline.log.topic``).
    """

    def __init__(
        self,
        bootstrap_servers: Sequence[str] | str,
        topic: str,
        *,
        timeout: float = DEFAULT_LOG_TIMEOUT,
        client_id: str = "throughline-log",
        kafka_config: KafkaClientConfig | None = None,
    ) -> None:
        """Connect (bounded by ``timeout`` seconds) and read the topic's partition count.

        Raises ``BrokerUnavailableError`` when no broker answers, a ``KafkaSecurityError`` when the
        connection's settings do not fit the listener, and ``TopicMissingError`` when the topic does
        not exist. ``kafka_config``: how to connect (``None``: ``THROUGHLINE_KAFKA_CONFIG``, else PLAINTEXT).
        """
        self._servers = bootstrap_list(bootstrap_servers)
        self._topic = topic
        self._timeout_ms = max(1000, int(timeout * 1000))
        self._lock = threading.Lock()
        self._closed = False
        self._consumer_closed = False
        self._errors = KafkaErrors(self._servers, kafka_config)
        self._consumer = clients.consumer(
            self._servers,
            client_id=client_id,
            connect_timeout=timeout,
            kafka_config=kafka_config,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",  # end offsets are the last stable offsets
            allow_auto_create_topics=False,
            request_timeout_ms=self._timeout_ms,
            retry_backoff_ms=RETRY_BACKOFF_MS,
        )
        # The partition count below waits for a metadata refresh: at kafka-python's backoff that was
        # ~110 ms of every projector's start (``prompt_metadata``).
        prompt_metadata(self._consumer)
        try:
            with self._lock, self._errors:
                ids = self._consumer.partitions_for_topic(topic)
        except LogError:
            self._consumer.close()
            raise
        if not ids:
            self._consumer.close()
            raise TopicMissingError(f"topic {topic!r} does not exist on {', '.join(self._servers)}")
        self._partitions = len(ids)
        every = range(self._partitions)
        self._ends: NextAnswer[dict[int, int]] = NextAnswer(lambda: self._ask(every, first=False))
        if set(ids) != set(range(self._partitions)):
            self._consumer.close()
            raise OtherKafkaError(f"topic {topic!r} reports partitions {sorted(ids)}")

    def end_offset(self, partition: int) -> int:
        """The partition's end offset (the offset the next record will get), asked of the broker now."""
        return self.end_offsets([partition])[partition]

    def end_offsets(self, partitions: Sequence[int] | None = None) -> dict[int, int]:
        """End offsets of ``partitions`` (all of the topic's by default), asked of the broker in one call."""
        return self._offsets(partitions, first=False)

    def beginning_offsets(self, partitions: Sequence[int] | None = None) -> dict[int, int]:
        """First offsets still in the log (above 0 once records were deleted), asked of the broker now."""
        return self._offsets(partitions, first=True)

    def _offsets(self, partitions: Sequence[int] | None, *, first: bool) -> dict[int, int]:
        wanted = list(range(self._partitions)) if partitions is None else list(partitions)
        for p in wanted:
            if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < self._partitions:
                raise UnknownPartitionError(
                    f"partition {p!r} is not one of topic {self._topic!r}'s {self._partitions} partitions",
                )
        if first:
            return self._ask(wanted, first=True)
        # Every partition's end in one request, shared by the calls that overlap (``NextAnswer``).
        ends = self._ends.get()
        return {p: ends[p] for p in wanted}

    def _ask(self, wanted: Sequence[int], *, first: bool) -> dict[int, int]:
        tps = [TopicPartition(self._topic, p) for p in wanted]
        self._acquire()
        try:
            with self._errors:
                ask = self._consumer.beginning_offsets if first else self._consumer.end_offsets
                answer = ask(tps, timeout_ms=self._timeout_ms)
        finally:
            self._release()
        return {tp.partition: int(offset) for tp, offset in answer.items()}

    def _acquire(self) -> None:
        """Take the consumer, or raise ``log_closed`` once the view is closed.

        While a broker fails over, every request waits out its timeout, and callers that queued behind
        it would each wait their turn (a queue of readers is several timeouts long). Waiting in slices,
        a queued caller sees the view closed and gives up at once: a closing service waits for the one
        request in flight, not for the queue behind it.
        """
        while True:
            if self._closed:
                raise LogClosedError("the log view is closed")
            if self._lock.acquire(timeout=_CLOSED_CHECK_S):
                if not self._closed:
                    return
                self._release()

    def _release(self) -> None:
        """Give the consumer back; the last user of a closed view closes the consumer."""
        try:
            if self._closed and not self._consumer_closed:
                self._consumer_closed = True
                self._consumer.close()
        finally:
            self._lock.release()
        # A close that came between the check above and the release found the lock taken: close now.
        if self._closed and not self._consumer_closed and self._lock.acquire(blocking=False):
            self._release()

    def close(self) -> None:
        """Close the view (idempotent, never waits for a request in flight).

        Later and queued calls raise ``log_closed`` at once; the consumer is closed now when nobody
        uses it, else by the request in flight when it returns (bounded by the view's timeout).
        """
        self._closed = True
        if self._lock.acquire(blocking=False):
            self._release()

    def __enter__(self) -> KafkaLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


if TYPE_CHECKING:

    def _implements_log_view(log: KafkaLog) -> LogView:  # mypy proves KafkaLog fits the port
        return log
