"""``TurnProducer``: appends completed turns to the log, one Avro record per turn (and an operator's
source repair records, ``send_repair``, the same way).

Guarantees:

- A turn is validated (``build_turn`` rules, the same the projector re-checks) and encoded *before*
  anything is sent, so an invalid or oversized turn raises ``InvalidTurnError`` / ``BodyTooLargeError``
  and nothing reaches the broker.
- One record per turn, and a Kafka record is atomic: a turn is in the log whole or not at all.
- The record key is the 32-byte project hash and the partition is chosen by us with
  ``partition_for(project_sha256, partition_count)`` (Kafka's murmur2 partitioner over that key), so the
  reader can compute a project's partition without asking the producer.
- The producer is idempotent (``enable_idempotence``, ``acks=all``, at most 5 requests in flight): broker
  retries neither duplicate nor reorder records of a partition, so the turns of one project land in the
  order they were sent.
- Every wait is bounded: connecting by ``connect_timeout``, each send by ``send_timeout`` (Kafka's
  ``delivery_timeout_ms``: the time to retry a send before its future fails). A broker that does not
  answer in time raises ``BrokerUnavailableError`` (retriable) naming the servers that were tried; a
  broker that refuses a record raises ``SendFailedError`` with the Kafka error's ``retriable`` flag.
  The bound runs from the call that hands the turn over, not from the batch kafka-python builds, and
  it holds even when the client cannot expire the batch: kafka-python's sender does not expire batches
  while an idempotent producer waits for its producer id, which no broker hands out while the
  controllers have no quorum (measured: 15.0 s waits for a 10 s send timeout, two of three nodes down).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import metadata
from types import TracebackType
from typing import Any

from throughline.core.chain import micros_since_epoch
from throughline.core.exceptions import InvalidReasonError, InvalidRepairError, InvalidTurnError
from throughline.core.repair import RepairRecord, verify_repair
from throughline.core.turn import TOPIC_MAX_MESSAGE_BYTES, TurnRecord, build_turn, parse_rfc3339, verify_turn
from throughline.errors import ThroughlineError
from throughline.log import (
    DEFAULT_PARTITIONS,
    BrokerUnavailableError,
    KafkaClientConfig,
    KafkaErrors,
    KafkaSecurityError,
    LogError,
    TopicClient,
    TopicInfo,
    bootstrap_list,
    check_topic,
    clients,
    describe_topic,
    ensure_topic,
    resolve_kafka_config,
    translate_kafka_error,
)
from throughline.log.exceptions import ClientClosedError, MessageTooLargeError
from throughline.producers.exceptions import (
    ProducerClosedError,
    ProducerError,
    RecordTooLargeError,
    SendFailedError,
)
from throughline.runtime import fewer_gc_passes
from throughline.schemas.codec import encode_repair, encode_turn
from throughline.schemas.registry import register_writer_schemas

DEFAULT_SEND_TIMEOUT = 30.0
DEFAULT_CONNECT_TIMEOUT = 15.0
DEFAULT_PRODUCER_NAME = "throughline"
#: Room left in a topic record for the key, the record and batch headers around the Avro value.
RECORD_OVERHEAD_BYTES = 4096
#: Bounded retries of a failed produce request; ``send_timeout`` usually ends the retrying first.
MAX_RETRIES = 100
LINGER_MS = 5
#: How long past ``send_timeout`` (counted from the send) ``PendingSend.result`` waits for the client's
#: own answer, its expiry of the batch, before answering ``BrokerUnavailableError`` itself.
RESULT_GRACE_S = 1.0
BATCH_BYTES = 128 * 1024
#: A compressed batch holds this many times ``BATCH_BYTES`` of records. kafka-python bounds a batch by
#: its records' uncompressed bytes (the Java client by its estimated compressed size): at the ~0.3x zstd
#: keeps of turn bodies, 3x keeps a compressed batch near ``BATCH_BYTES`` on the wire, and the sender
#: thread's fixed cost of a batch (0.3 ms or more, measured: the request, its answer, the batch's
#: bookkeeping) is paid a third as often (docs/benchmarks.md, Compression). Even a batch that does not
#: compress (sent as is) stays well below the topic's record limit (``TOPIC_MAX_MESSAGE_BYTES``).
COMPRESSED_BATCH_FACTOR = 3
#: The codec of the producer's record batches. Turn bodies are text (prose, code, tool output): zstd
#: is the one codec that keeps them in at most 0.4x the uncompressed bytes on the broker (lz4 and
#: snappy: ~0.45x; gzip as small but ~2.5x the producer's CPU; docs/benchmarks.md, Compression). Every
#: reader decompresses any codec (pyproject's dependencies).
COMPRESSION = "zstd"


def batch_bytes(compression: str | None) -> int:
    """kafka-python's ``batch_size`` (records' uncompressed bytes) for batches compressed with ``compression``."""
    return BATCH_BYTES if compression is None else BATCH_BYTES * COMPRESSED_BATCH_FACTOR


def _version() -> str:
    try:
        return metadata.version("throughline")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"


PRODUCER_VERSION = _version()


@dataclass(frozen=True, slots=True)
class LogPosition:
    """Where the log acknowledged a record: its partition and offset (what makes two positions equal),
    and the record's timestamp as the log keeps it.

    ``timestamp_ms``: milliseconds since the epoch; on a topic with ``message.timestamp.type =
    LogAppendTime`` the broker's clock when it appended the record's batch, else the producer's create
    time; ``None`` when the broker did not say.
    """

    partition: int
    offset: int
    timestamp_ms: int | None = dataclasses.field(default=None, compare=False)


def _position(meta: Any) -> LogPosition:
    """The ``LogPosition`` of kafka-python's ``RecordMetadata``."""
    stamp = meta.timestamp
    return LogPosition(int(meta.partition), int(meta.offset), int(stamp) if stamp is not None and stamp >= 0 else None)


def completed_at_micros(value: datetime | str | int) -> int:
    """Microseconds since the epoch of an aware datetime, an RFC 3339 string or an int (kept as is)."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidTurnError("completedAt must carry a time zone")
        return micros_since_epoch(value)
    if isinstance(value, str):
        return parse_rfc3339(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise InvalidTurnError("completedAt must be an aware datetime, an RFC 3339 string or integer microseconds")


def _now_micros() -> int:
    return time.time_ns() // 1000


def checked_turn(turn: TurnRecord) -> TurnRecord:
    """Re-validate a turn built elsewhere (typed errors), and check its derived fields agree with it."""
    if not isinstance(turn, TurnRecord):
        raise InvalidTurnError(f"expected a TurnRecord, got {type(turn).__name__}")
    for key, value in turn.producer.attributes.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidTurnError("producer attributes must map strings to strings")
    problem = verify_turn(turn)
    if problem is None:
        return turn  # the usual case, checked without building a second record
    # Rebuild the turn for the exact typed error (InvalidProjectError, BodyTooLargeError, ...).
    rebuilt = build_turn(
        project=turn.project,
        host=turn.host,
        thread=turn.thread,
        turn_id=turn.turn_id,
        completed_at_micros=turn.completed_at_micros,
        body=turn.body,
        seq=turn.seq,
    )
    if rebuilt.project != turn.project:
        raise InvalidTurnError("project is not in canonical form (build turns with build_turn)")
    if rebuilt.project_sha256 != turn.project_sha256:
        raise InvalidTurnError("projectSha256 does not match the project")
    if rebuilt.content_digest != turn.content_digest:
        raise InvalidTurnError("contentDigest does not match the turn's content")
    raise InvalidTurnError(problem)


class PendingSend:
    """A turn handed to the producer whose acknowledgement has not been awaited yet."""

    __slots__ = ("_future", "_owner", "_sent_at", "turn_id")

    def __init__(self, owner: TurnProducer, future: Any, turn_id: str, sent_at: float) -> None:
        self._owner = owner
        self._future = future
        self.turn_id = turn_id  # not the turn: a pending send must not pin its body in memory
        self._sent_at = sent_at  # time.monotonic() before the hand-over: the send timeout runs from it

    @property
    def done(self) -> bool:
        """True once the broker acknowledged the record or the send failed."""
        return bool(self._future.is_done)

    def acknowledged(self) -> LogPosition | None:
        """Where the turn landed if the broker already acknowledged it, else ``None`` (not waiting).

        ``send_many`` reads its positions this way after the flush: ``result`` would set up a wait
        and the error translation for each turn (~2 us a turn, measured).
        """
        future = self._future
        if future.is_done and future.exception is None:
            return _position(future.value)
        return None

    def when_done(self, on_acknowledged: Callable[[LogPosition], None], on_failed: Callable[[Exception], None]) -> None:
        """Call ``on_acknowledged(position)`` once the broker acknowledged the turn, or ``on_failed(error)``
        (the error ``result`` would raise) once the send failed; at once, on this thread, if it is done.

        The callback runs on the producer's network thread, at the instant its acknowledgement is read:
        keep it short and never block there (every other send waits behind it). An exception it raises
        is logged by kafka-python and otherwise ignored. This is how a caller follows many sends without
        a thread waiting on each (``result``).
        """
        owner = self._owner

        def acknowledged(meta: Any) -> None:
            on_acknowledged(_position(meta))

        def failed(exc: BaseException) -> None:
            errors = owner.kafka_errors
            on_failed(owner.send_error(translate_kafka_error(exc, errors.servers, errors.config)))

        self._future.add_callback(acknowledged)
        self._future.add_errback(failed)

    def result(self, timeout: float | None = None) -> LogPosition:
        """Wait for the acknowledgement: at most ``timeout``, by default until the producer's send timeout
        (and ``RESULT_GRACE_S``) has passed since the turn was handed over, however long that took."""
        if timeout is None:
            deadline = self._sent_at + self._owner.send_timeout + RESULT_GRACE_S
            timeout = max(0.0, deadline - time.monotonic())
        try:
            with self._owner.kafka_errors:
                meta = self._future.get(timeout=timeout)
        except LogError as exc:
            raise self._owner.send_error(exc) from exc
        return _position(meta)


class TurnProducer(TopicClient):
    """Appends completed turns to the topic (a context manager; thread-safe like ``KafkaProducer``).

    ``topic``, ``partitions``, ``bootstrap_servers`` and ``partition_of`` are ``TopicClient``'s."""

    def __init__(
        self,
        bootstrap_servers: Sequence[str] | str,
        topic: str,
        *,
        ensure: bool = True,
        partitions: int = DEFAULT_PARTITIONS,
        allow_lossy: bool = False,
        send_timeout: float = DEFAULT_SEND_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        producer_name: str = DEFAULT_PRODUCER_NAME,
        client_id: str | None = None,
        kafka_config: KafkaClientConfig | None = None,
        replication_factor: int | None = None,
        min_insync_replicas: int | None = None,
    ) -> None:
        """Check (``ensure``: create when missing) the topic, then connect an idempotent producer.

        Raises ``BrokerUnavailableError`` when no broker answers within ``connect_timeout``, a
        ``KafkaSecurityError`` when the connection's settings do not fit the listener (a wrong password,
        an untrusted certificate, ...), ``TopicMissingError`` when ``ensure`` is false and the topic does
        not exist, ``LossyTopicError`` when the topic would lose records (``LossyTopicReplicationError``:
        acknowledged turns, by its replication) and ``allow_lossy`` is false, and ``InvalidReplicationError``
        when ``replication_factor``/``min_insync_replicas`` (used when the topic is created; the bar the
        check applies) do not fit the cluster. ``kafka_config``: how to connect (``None``: ``THROUGHLINE_KAFKA_CONFIG``, else PLAINTEXT).
        """
        if not send_timeout >= 1.0:
            raise ValueError("send_timeout must be at least 1 second")
        self._servers = bootstrap_list(bootstrap_servers)
        self._topic = topic
        self.send_timeout = float(send_timeout)
        self._producer_name = producer_name
        self.kafka_errors = KafkaErrors(self._servers, kafka_config)
        if ensure:
            info = ensure_topic(
                self._servers,
                topic,
                partitions=partitions,
                allow_lossy=allow_lossy,
                timeout=connect_timeout,
                kafka_config=kafka_config,
                replication_factor=replication_factor,
                min_insync_replicas=min_insync_replicas,
            )
        else:
            info = describe_topic(self._servers, topic, timeout=connect_timeout, kafka_config=kafka_config)
            check_topic(
                info,
                allow_lossy=allow_lossy,
                replication_factor=replication_factor,
                min_insync_replicas=min_insync_replicas,
            )
        self._info = info
        self._partitions = info.partitions
        # With a schema registry, the writer schemas are registered (and checked for compatibility)
        # before the producer connects: an incompatible schema refuses the run with nothing sent.
        registry = (resolve_kafka_config() if kafka_config is None else kafka_config).schema_registry
        self._turn_header: bytes | None = None
        self._repair_header: bytes | None = None
        if registry is not None:
            headers = register_writer_schemas(registry, topic)
            self._turn_header, self._repair_header = headers.turn, headers.repair
        delivery_ms = int(self.send_timeout * 1000)
        self._producer = clients.producer(
            self._servers,
            client_id=client_id or f"{producer_name}-producer",
            connect_timeout=connect_timeout,
            kafka_config=kafka_config,
            acks="all",
            enable_idempotence=True,
            max_in_flight_requests_per_connection=5,
            retries=MAX_RETRIES,
            delivery_timeout_ms=delivery_ms,
            # Kafka requires delivery >= linger + request timeout.
            request_timeout_ms=min(30_000, delivery_ms - LINGER_MS),
            max_block_ms=delivery_ms,
            max_request_size=TOPIC_MAX_MESSAGE_BYTES,
            linger_ms=LINGER_MS,
            batch_size=batch_bytes(COMPRESSION),
            compression_type=COMPRESSION,
            # Our topic is created on purpose (infinite retention); never let a send auto-create one.
            allow_auto_create_topics=False,
        )
        self._closed = False

    # ------------------------------------------------------------------------------------------ facts

    @property
    def topic_info(self) -> TopicInfo:
        """What the broker said about the topic when the producer started."""
        return self._info

    # ------------------------------------------------------------------------------------------ sending

    def send(self, turn: TurnRecord) -> LogPosition:
        """Append one turn and wait until the log acknowledged it; return where it landed."""
        return self.send_async(turn).result()

    def send_many(self, turns: Iterable[TurnRecord]) -> list[LogPosition]:
        """Append turns pipelined (send all, then wait); positions are in the order of ``turns``.

        Every turn is validated before the first is sent, so an invalid turn means none was sent. Turns of
        one project land in the given order. When a send fails, the others are still awaited and then
        the first failure (in input order) is raised; turns before it may be in the log, and sending
        them again is harmless (the projector applies a turn id once).
        """
        positions: list[LogPosition] = []
        first_error: Exception | None = None
        # The positions too: one per turn, allocated while every future is still alive (measured: ~5%
        # of send_many's time at 50k turns when the collector walked them at its default threshold).
        with fewer_gc_passes():
            prepared = [self._prepare(t) for t in turns]
            pending = [self._submit(turn, value) for turn, value in prepared]
            try:
                with self.kafka_errors:
                    self._producer.flush(timeout=self.send_timeout + RESULT_GRACE_S)
            except LogError:
                pass  # each pending send below reports its own failure
            for p in pending:
                acked = p.acknowledged()
                if acked is not None:
                    positions.append(acked)
                    continue
                try:
                    positions.append(p.result())
                except (ProducerError, LogError) as exc:
                    first_error = first_error or exc
        if first_error is not None:
            raise first_error
        return positions

    def send_async(self, turn: TurnRecord, *, validated: bool = False) -> PendingSend:
        """Validate, encode and hand a turn to the producer; await ``result()`` for the acknowledgement.

        ``validated=True`` skips re-checking a turn that comes straight from ``build_turn`` (the
        projector verifies every record anyway); never pass it for a turn from elsewhere.
        """
        turn, value = self._prepare(turn, validated=validated)
        return self._submit(turn, value)

    def append(
        self,
        *,
        project: str,
        host: str,
        thread: str,
        turn_id: str,
        completed_at: datetime | str | int,
        body: str,
        seq: int | None = None,
        attributes: Mapping[str, str] | None = None,
    ) -> LogPosition:
        """Build a turn from its fields (``build_turn``) and append it; ``completed_at`` is an aware
        datetime, an RFC 3339 string or integer microseconds since the epoch."""
        return self.send_async(
            validated=True,
            turn=self.build(
                project=project,
                host=host,
                thread=thread,
                turn_id=turn_id,
                completed_at=completed_at,
                body=body,
                seq=seq,
                attributes=attributes,
            ),
        ).result()

    def build(
        self,
        *,
        project: str,
        host: str,
        thread: str,
        turn_id: str,
        completed_at: datetime | str | int,
        body: str,
        seq: int | None = None,
        attributes: Mapping[str, str] | None = None,
    ) -> TurnRecord:
        """A turn stamped with this producer's name, version and the current time (not sent)."""
        return build_turn(
            project=project,
            host=host,
            thread=thread,
            turn_id=turn_id,
            completed_at_micros=completed_at_micros(completed_at),
            body=body,
            seq=seq,
            producer_name=self._producer_name,
            producer_version=PRODUCER_VERSION,
            produced_at_micros=_now_micros(),
            attributes=attributes,
        )

    def send_repair(self, repair: RepairRecord) -> LogPosition:
        """Append one source repair record (``throughline repair``) to its project's partition, keyed
        like the project's turns so that it lands in their order, and wait for the acknowledgement.

        The record is checked (``verify_repair``) and encoded before anything is sent: an unsound one
        raises ``InvalidRepairError`` and nothing reaches the broker.
        """
        problem = verify_repair(repair)
        if problem is not None:
            raise InvalidReasonError(problem)
        try:
            value = encode_repair(repair, self._repair_header)
        except Exception as exc:  # fastavro raises TypeError/ValueError/OverflowError for a bad field
            raise InvalidRepairError(f"the repair does not encode as a record: {type(exc).__name__}: {exc}") from None
        return self._send(repair.project_sha256, value, "repair").result()

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every handed-over turn is acknowledged or failed (bounded by the send timeout)."""
        try:
            with self.kafka_errors:
                self._producer.flush(timeout=self.send_timeout + 5.0 if timeout is None else timeout)
        except LogError as exc:
            raise self.send_error(exc) from exc

    def close(self, timeout: float | None = None) -> None:
        """Flush and close (idempotent). Turns not acknowledged within ``timeout`` (default: the send
        timeout + 5 s) are abandoned and ``BrokerUnavailableError`` is raised."""
        if self._closed:
            return
        self._closed = True
        try:
            with self.kafka_errors:
                self._producer.close(timeout=self.send_timeout + 5.0 if timeout is None else timeout)
        except LogError as exc:
            # kafka-python leaves its sender thread running when the final flush times out.
            sender = getattr(self._producer, "_sender", None)
            if sender is not None:
                sender.force_close()
            raise BrokerUnavailableError(
                self._servers, f"turns were still unacknowledged when the producer closed ({exc})"
            ) from exc

    def __enter__(self) -> TurnProducer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
            return
        # An error is already on its way up: do not wait out a long send timeout, and do not mask it.
        try:
            self.close(timeout=5.0)
        except ThroughlineError:
            pass

    # ------------------------------------------------------------------------------------------ internals

    def _prepare(self, turn: TurnRecord, *, validated: bool = False) -> tuple[TurnRecord, bytes]:
        if not validated:
            turn = checked_turn(turn)
        if turn.producer.produced_at_micros == 0:
            stamp = dataclasses.replace(turn.producer, produced_at_micros=_now_micros())
            turn = dataclasses.replace(turn, producer=stamp)
        try:
            value = encode_turn(turn) if self._turn_header is None else encode_turn(turn, self._turn_header)
        except Exception as exc:  # fastavro raises TypeError/ValueError/OverflowError for a bad field
            raise InvalidTurnError(f"the turn does not encode as a record: {type(exc).__name__}: {exc}") from None
        limit = TOPIC_MAX_MESSAGE_BYTES - RECORD_OVERHEAD_BYTES
        if len(value) > limit:
            raise RecordTooLargeError(f"the encoded turn is {len(value)} bytes; the limit is {limit} bytes")
        return turn, value

    def _submit(self, turn: TurnRecord, value: bytes) -> PendingSend:
        return self._send(turn.project_sha256, value, turn.turn_id)

    def _send(self, project_sha256: bytes, value: bytes, label: str) -> PendingSend:
        """Hand one record of the project to kafka-python: keyed by the project hash, on its partition; its
        send timeout runs from now (kafka-python may block in the hand-over, waiting for metadata)."""
        if self._closed:
            raise ProducerClosedError("the producer is closed")
        sent_at = time.monotonic()
        partition = self.partition_of(project_sha256)
        try:
            with self.kafka_errors:
                future = self._producer.send(self._topic, value=value, key=project_sha256, partition=partition)
        except LogError as exc:
            raise self.send_error(exc) from exc
        return PendingSend(self, future, label, sent_at)

    def send_error(self, exc: LogError) -> Exception:
        """The producer's error for a (translated) Kafka error raised while sending."""
        if isinstance(exc, BrokerUnavailableError):
            return BrokerUnavailableError(
                self._servers, f"no acknowledgement within {self.send_timeout:g}s ({exc.detail})"
            )
        if isinstance(exc, KafkaSecurityError):
            return exc  # a setting to fix, with its own code
        if isinstance(exc, MessageTooLargeError):
            return SendFailedError(exc.message, retriable=False)
        if isinstance(exc, ClientClosedError):
            return ProducerClosedError(f"the producer cannot send: {exc.message}")
        return SendFailedError(f"the broker refused the turn: {exc.message}", retriable=exc.retriable)
