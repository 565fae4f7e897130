"""Prepare: decode and check the records of one partition, with no projection state.

This is the half of applying a batch that needs nothing but the records' bytes, so it can run
anywhere: on the projector's thread, or in the fetch worker process (``throughline.projector.feed``)
while the main process folds and writes the previous batch. It imports neither DuckDB nor Arrow, so
that worker starts quickly, and what it returns pickles cheaply: a sound record is a flat
``NamedTuple`` of the fields the fold and the writes read, not a ``TurnRecord``. Records are decoded
with ``decode_log_datum``: a repair record (``throughline.core.repair``) becomes a ``RepairItem``,
which the store applies in log order among the turns.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from throughline.core.fold import partition_key_problem
from throughline.core.identity import source_sha256
from throughline.core.partitioning import partition_for
from throughline.core.repair import RepairRecord, repair_problem
from throughline.core.turn import content_problem, verify_turn_fields
from throughline.projector.exceptions import InvalidBatchError
from throughline.schemas.codec import decode_log_datum
from throughline.schemas.exceptions import RecordDecodeError, RegistryError

# Quarantine codes (stable: operators filter on them).
Q_UNDECODABLE = "record_undecodable"
Q_UNKNOWN_SCHEMA = "unknown_schema"
Q_INVALID = "record_invalid"
Q_MISPLACED = "record_misplaced"
Q_CHAIN = "chain_rejected"

#: The domain of a turn key (``turn_key``): the store recomputes keys in SQL with it (``store.cut_files``).
TURN_KEY_DOMAIN = b"throughline.turnid.v1\x00"


def turn_key(source_sha256: bytes, turn_id: str) -> bytes:
    """The 128-bit key of one (source, turn id) pair in ``turn_ids``."""
    return hashlib.sha256(TURN_KEY_DOMAIN + source_sha256 + turn_id.encode("utf-8")).digest()[:16]


class RecordLike(Protocol):
    """What the apply path reads of a topic record (``LogRecord``, or kafka-python's ``ConsumerRecord``)."""

    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One topic record as the projector sees it: where it is and its raw bytes."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class SoundRecord(NamedTuple):
    """A record that decoded and is sound on its own; the fold still has to place it.

    Only what the fold and the writes read (and the raw key and value, which a record the fold
    rejects is quarantined with). A tuple, because thousands of them cross from the fetch worker to
    the main process per poll and a tuple pickles at a fraction of a dataclass's cost.
    """

    offset: int
    key: bytes | None
    value: bytes
    source: bytes
    turn_key: bytes
    project_sha256: bytes
    turn_id: str
    seq: int | None
    completed_at_micros: int
    body: str
    body_bytes: int
    content_digest: bytes


class RefusedRecord(NamedTuple):
    """A record quarantined before the fold (undecodable, unsound, on the wrong partition)."""

    offset: int
    key: bytes | None
    value: bytes | None
    code: str
    reason: str
    project_sha256: bytes | None = None
    source: bytes | None = None


class RepairItem(NamedTuple):
    """A sound repair record (``throughline.core.repair``): what the store needs to apply it.

    The store decides what it does from the projection's state at its position; nothing here depends
    on that state. The raw bytes are not kept: a sound repair is never quarantined, and the ``repairs``
    table holds every field it carries that the projection uses.
    """

    offset: int
    project_sha256: bytes
    source: bytes
    reason: str
    produced_at_micros: int


Item = SoundRecord | RefusedRecord | RepairItem


@dataclass(frozen=True, slots=True)
class PreparedBatch:
    """The records of one partition, decoded and checked (no projection state needed to build it).

    ``next_offset`` is the partition's applied offset once the batch is applied: one past its last
    record, or later when the consumer's position skipped offsets that hold no record.
    """

    partition: int
    items: tuple[Item, ...]
    next_offset: int

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled column by column: a poll's thousands of records cross from the fetch worker as a
        # dozen lists of plain values (~1 us a record each way instead of ~7 for the tuples).
        sound = [it for it in self.items if type(it) is SoundRecord]
        refused = [tuple(it) for it in self.items if type(it) is RefusedRecord]
        repairs = [tuple(it) for it in self.items if type(it) is RepairItem]
        columns = tuple(zip(*sound, strict=True))
        return (_rebuild_batch, (self.partition, columns, refused, self.next_offset, repairs))


def record_projects(batch: PreparedBatch) -> list[tuple[int, bytes | None]]:
    """(offset, project hash) of each record of ``batch``; ``None`` where the record names no project
    for sure (it did not decode)."""
    return [(it.offset, it.project_sha256) for it in batch.items]


def merge_polls(polls: Sequence[Sequence[PreparedBatch]]) -> list[PreparedBatch]:
    """Consecutive polls as one: per partition, the batches' records in log order and the last next offset.

    The polls must follow each other on every partition (each batch starts at or after the previous
    one's ``next_offset``), as a feed delivers them; the result is what one larger poll would have been.
    """
    if len(polls) == 1:
        return list(polls[0])
    parts: dict[int, tuple[list[Item], int]] = {}
    for poll in polls:
        for b in poll:
            items, end = parts.get(b.partition, ([], -1))
            if b.items and b.items[0].offset < end:
                raise InvalidBatchError(
                    f"partition {b.partition}: a poll starting at offset {b.items[0].offset} follows one ending at {end}"
                )
            items.extend(b.items)
            parts[b.partition] = (items, max(end, b.next_offset))
    return [PreparedBatch(p, tuple(items), end) for p, (items, end) in parts.items()]


def split_poll(batches: Sequence[PreparedBatch], most: int) -> list[list[PreparedBatch]]:
    """A poll as consecutive smaller ones of at most ``most`` records each: what the feed would have
    delivered with a smaller ``max_poll_records``. A partition's batch longer than ``most`` is cut (a
    part's ``next_offset`` is the next part's first offset: the offsets between hold no record; the last
    part's is the batch's own); the pieces are then packed in order, several partitions to a part while
    they fit, so that no more parts (transactions) come out than the bound asks for."""
    pieces: list[PreparedBatch] = []
    for b in batches:
        if len(b.items) <= most:
            pieces.append(b)
            continue
        for first in range(0, len(b.items), most):
            chunk = b.items[first : first + most]
            rest = first + most
            end = b.items[rest].offset if rest < len(b.items) else b.next_offset
            pieces.append(PreparedBatch(b.partition, chunk, end))
    parts: list[list[PreparedBatch]] = []
    room = 0
    for piece in pieces:
        fits = parts and len(piece.items) <= room and all(b.partition != piece.partition for b in parts[-1])
        if not fits:
            parts.append([])
            room = most
        parts[-1].append(piece)
        room -= len(piece.items)
    return parts


def _rebuild_batch(
    partition: int,
    columns: tuple[tuple[Any, ...], ...],
    refused: list[tuple[Any, ...]],
    next_offset: int,
    repairs: list[tuple[Any, ...]],
) -> PreparedBatch:
    items: list[Item] = list(map(SoundRecord._make, zip(*columns, strict=True)))
    if refused or repairs:
        items.extend(RefusedRecord._make(r) for r in refused)
        items.extend(RepairItem._make(r) for r in repairs)
        items.sort(key=lambda it: it.offset)  # back in log order
    return PreparedBatch(partition, tuple(items), next_offset)


def check_content(batch: PreparedBatch) -> PreparedBatch:
    """``batch`` (prepared with ``defer_content``) with each sound record whose content digest is not its
    content's refused as ``prepare_batch`` refuses it (``record_invalid``); the same batch when none is."""
    refused: dict[int, RefusedRecord] = {}
    for i, it in enumerate(batch.items):
        if type(it) is SoundRecord:
            problem = content_problem(it.turn_id, it.completed_at_micros, it.body.encode("utf-8"), it.content_digest)
            if problem is not None:
                refused[i] = RefusedRecord(
                    it.offset, it.key, it.value, Q_INVALID, problem, it.project_sha256, it.source
                )
    if not refused:
        return batch
    items = tuple(refused.get(i, it) for i, it in enumerate(batch.items))
    return PreparedBatch(batch.partition, items, batch.next_offset)


def _refuse_decoded(
    offset: int, key: bytes | None, value: bytes, datum: dict[str, Any], reason: str, code: str
) -> RefusedRecord:
    project_hash = datum.get("projectSha256")
    if not (isinstance(project_hash, bytes) and len(project_hash) == 32):
        return RefusedRecord(offset, key, value, code, reason)
    try:
        source: bytes | None = source_sha256(project_hash, datum["host"], datum["thread"])
    except Exception:  # unencodable host/thread: the record stays quarantined without a source hash
        source = None
    return RefusedRecord(offset, key, value, code, reason, project_hash, source)


@functools.lru_cache(maxsize=65536)
def _source(project_hash: bytes, host: str, thread: str) -> bytes:
    # A source writes many turns: its hash is worth remembering.
    return source_sha256(project_hash, host, thread)


def _problem(datum: dict[str, Any], key: bytes | None, check_content: bool = True) -> str | None:
    """``record_problem`` on a datum (the projector never builds the ``TurnRecord``). Without
    ``check_content`` the content digest is left out for a record with no other problem; it still ranks
    before the partition key's, so a record refused for its key has its digest checked first."""
    project_hash = datum["projectSha256"]
    problem = verify_turn_fields(
        datum["project"],
        project_hash,
        datum["host"],
        datum["thread"],
        datum["turnId"],
        datum["seq"],
        datum["completedAt"],
        datum["body"],
        datum["contentDigest"],
        check_content=check_content,
    )
    if problem is not None:
        return problem
    key_problem = partition_key_problem(project_hash, key)
    if key_problem is not None and not check_content:
        return _datum_content_problem(datum) or key_problem
    return key_problem


def _datum_content_problem(datum: dict[str, Any]) -> str | None:
    return content_problem(datum["turnId"], datum["completedAt"], datum["body"].encode("utf-8"), datum["contentDigest"])


def _sound(offset: int, key: bytes | None, value: bytes, datum: dict[str, Any]) -> SoundRecord:
    project_hash = datum["projectSha256"]
    source = _source(project_hash, datum["host"], datum["thread"])
    turn_id = datum["turnId"]
    body = datum["body"]
    # A sound body is valid Unicode (verify_turn_fields encoded it); ASCII, the usual case, needs no copy.
    size = len(body) if body.isascii() else len(body.encode("utf-8"))
    return SoundRecord(
        offset,
        key,
        value,
        source,
        turn_key(source, turn_id),
        project_hash,
        turn_id,
        datum["seq"],
        datum["completedAt"],
        body,
        size,
        datum["contentDigest"],
    )


def _prepare_repair(
    offset: int, key: bytes | None, value: bytes, record: RepairRecord, partition: int, partitions: int | None
) -> RefusedRecord | RepairItem:
    """A decoded repair record checked like a turn: unsound (``record_invalid``), on another project's
    partition (``record_misplaced``), or sound. A refused one keeps its project and source, so a later
    sound repair of that source marks it too (``ChainBook.apply_repair``)."""
    project_hash, source = record.project_sha256, record.source_sha256
    problem = repair_problem(record, key)
    code = Q_INVALID
    if problem is None and partitions is not None:
        home = partition_for(project_hash, partitions)
        if home != partition:
            problem = f"record is on partition {partition} but its project belongs on partition {home}"
            code = Q_MISPLACED
    if problem is not None:
        return RefusedRecord(offset, key, value, code, problem, project_hash, source)
    return RepairItem(offset, project_hash, source, record.reason, record.producer.produced_at_micros)


def prepare_batch(
    partition: int,
    records: Sequence[RecordLike],
    *,
    partitions: int | None = None,
    next_offset: int | None = None,
    defer_content: bool = False,
) -> PreparedBatch:
    """Decode and check the records of one partition (pure; safe on any thread or process).

    ``key`` should be the project hash (``record_problem``'s checks refuse another project's record under a
    key; a record without a key is checked by its project alone). ``partitions`` is the topic's
    partition count when known: a record whose project belongs on another partition is quarantined,
    because the turns of one project must be totally ordered.
    With ``defer_content`` the records it finds sound are returned without their content digest
    checked: ``check_content`` must then run on the batch before anything folds it (the fetch worker
    leaves that SHA-256 over each body, ~9% of its time, to the main process; see ``check_content``).
    Raises ``InvalidBatchError`` when records are of another partition or not in ascending offsets.
    """
    items: list[Item] = []
    last = -1
    for rec in records:
        if rec.partition != partition:
            raise InvalidBatchError(f"record of partition {rec.partition} in a batch of partition {partition}")
        if rec.offset <= last:
            raise InvalidBatchError(f"offsets must ascend within a batch ({rec.offset} after {last})")
        last = rec.offset
        key, value = rec.key, rec.value
        if value is None:
            items.append(RefusedRecord(rec.offset, key, None, Q_UNDECODABLE, "record has no value (a tombstone)"))
            continue
        try:
            datum = decode_log_datum(value)
            if isinstance(datum, RepairRecord):
                items.append(_prepare_repair(rec.offset, key, value, datum, partition, partitions))
                continue
            problem = _problem(datum, key, check_content=not defer_content)
        except RecordDecodeError as exc:
            items.append(RefusedRecord(rec.offset, key, value, exc.code, exc.message))
            continue
        except RegistryError:
            raise  # the registry is away or refuses us: not the record's fault, so retry it, never quarantine
        except Exception as exc:  # a poison record must never stop the projector: quarantine it, say why
            reason = f"record could not be read: {type(exc).__name__}: {exc}"
            items.append(RefusedRecord(rec.offset, key, value, Q_UNDECODABLE, reason))
            continue
        if problem is not None:
            items.append(_refuse_decoded(rec.offset, key, value, datum, problem, Q_INVALID))
            continue
        if partitions is not None:
            # Every record of a project must be on the project's partition, or its turns would have no
            # total order (and replay could fold them differently from streaming).
            home = partition_for(datum["projectSha256"], partitions)  # cached per project
            if home != partition:
                # Deferred, the content digest still ranks before the partition's check.
                content = _datum_content_problem(datum) if defer_content else None
                if content is not None:
                    items.append(_refuse_decoded(rec.offset, key, value, datum, content, Q_INVALID))
                    continue
                reason = f"record is on partition {partition} but its project belongs on partition {home}"
                items.append(_refuse_decoded(rec.offset, key, value, datum, reason, Q_MISPLACED))
                continue
        items.append(_sound(rec.offset, key, value, datum))
    end = last + 1 if records else 0
    if next_offset is not None:
        if next_offset < end:
            raise InvalidBatchError(f"next offset {next_offset} is below the batch's last offset {last}")
        end = next_offset
    return PreparedBatch(partition, tuple(items), end)
