"""A repair of a broken source, as it travels on the log, and what applying it decides (pure).

A source is *broken* once the fold rejected one of its records (a gap): the reader refuses to serve it, because its chain as applied disagrees with what the host
sent. An operator repairs it by appending a ``RepairRecord`` to the project's partition (``throughline
repair``). When the projector applies the record at log position (partition, offset):

- every quarantined record of that source on that partition below ``offset`` that no earlier repair
  marked is marked *repaired by* (partition, offset); the records stay in the quarantine as the audit
  trail;
- the source's broken mark is lifted: its chain as applied (nothing of it changes) is accepted and
  served again, and later records fold onto it as always (a turn with seq = length + 1 appends);
- the outcome (``decide_repair``) is kept with the record: ``repaired``, ``not_broken`` (a source the
  projection knows, with nothing to repair: the record changes nothing) or ``unknown_source`` (no
  record of that source in that project was ever applied: nothing changes either).

A record that breaks the source after the repair marks it broken again; a second repair is needed.
A repair record that is unsound (``repair_problem``) is quarantined like any poison record and changes
nothing. Everything a repair does is a function of the log up to its position, so a replay of the log
reproduces it exactly. docs/operations.md has the operator's side.

What a projection that applies repairs must do (``ChainBook.apply_repair`` is the reference): decode
with ``decode_log_datum`` (a ``RepairRecord`` rather than a turn's datum), refuse it with
``repair_problem`` and the partition check as it refuses turns, and, in log order among the batch's
turns and inside the batch's one transaction with the partition's applied offset: count the source's
unmarked quarantined records on the partition below the offset (stored ones and the batch's own),
call ``decide_repair``, mark them, clear the broken mark, and keep the repair with its outcome and
the chain length it accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from throughline.core.exceptions import (
    InvalidReasonError,
    InvalidSourceError,
    InvalidTurnError,
    RepairArgumentsError,
)
from throughline.core.identity import project_sha256, source_sha256, validate_name
from throughline.core.turn import ProducerStamp

#: Longest repair reason, in UTF-8 bytes (a paragraph; the log is not a ticket system).
MAX_REASON_BYTES = 4096

REPAIRED = "repaired"
NOT_BROKEN = "not_broken"
UNKNOWN_SOURCE = "unknown_source"
#: Every repair outcome (stable: ``quarantine --json`` and ``status`` print them).
REPAIR_OUTCOMES = (REPAIRED, NOT_BROKEN, UNKNOWN_SOURCE)


@dataclass(frozen=True, slots=True)
class RepairRecord:
    """One repair of one source, as carried by one topic record (hash-only)."""

    project_sha256: bytes
    source_sha256: bytes
    reason: str
    producer: ProducerStamp = field(default_factory=ProducerStamp)


def parse_source_hash(text: object) -> bytes:
    """The 32 bytes of a source hash given as 64 hexadecimal characters (``--source``)."""
    if not isinstance(text, str) or len(text) != 64:
        raise InvalidSourceError("a source hash is 64 hexadecimal characters (sourceSha256)")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise InvalidSourceError("a source hash is 64 hexadecimal characters (sourceSha256)") from None


def build_repair(
    *,
    project: str,
    reason: str,
    host: str | None = None,
    thread: str | None = None,
    source: bytes | None = None,
    producer_name: str = "throughline",
    producer_version: str = "0",
    produced_at_micros: int = 0,
    attributes: Mapping[str, str] | None = None,
) -> RepairRecord:
    """A checked repair of the source named by (``host``, ``thread``) or by its hash ``source``.

    The project is canonicalised and hashed (``invalid_project``); host and thread are hashed into the
    source identity and kept nowhere. Raises ``InvalidRepairError`` (``invalid_source``,
    ``invalid_reason``, ``invalid_arguments``) for what the record cannot carry.
    """
    project_hash = project_sha256(project)
    if source is not None:
        if host is not None or thread is not None:
            raise RepairArgumentsError("name the source by --host and --thread, or by --source, not both")
        if not isinstance(source, bytes) or len(source) != 32:
            raise InvalidSourceError("a source hash is 32 bytes")
        source_hash = source
    else:
        if host is None or thread is None:
            raise RepairArgumentsError("name the source by --host and --thread together, or by --source")
        try:
            source_hash = source_sha256(project_hash, validate_name(host, "host"), validate_name(thread, "thread"))
        except InvalidTurnError as exc:  # an empty, too long, NUL-holding or unencodable name
            raise InvalidSourceError(f"the source cannot be named so: {exc.message}") from None
    record = RepairRecord(
        project_sha256=project_hash,
        source_sha256=source_hash,
        reason=reason,
        producer=ProducerStamp(producer_name, producer_version, produced_at_micros, dict(attributes or {})),
    )
    problem = verify_repair(record)
    if problem is not None:
        raise InvalidReasonError(problem)
    return record


def verify_repair(record: RepairRecord) -> str | None:
    """Why a decoded repair record must not be applied, or ``None`` when it is sound."""
    for name in ("project_sha256", "source_sha256"):
        value = getattr(record, name)
        if not isinstance(value, bytes) or len(value) != 32:
            return f"{name} must be 32 bytes"
    reason = record.reason
    if not isinstance(reason, str) or not reason.strip():
        return "a repair needs a reason (the operator's words)"
    if "\x00" in reason:
        return "the repair reason must not contain NUL"
    try:
        size = len(reason.encode("utf-8"))
    except UnicodeEncodeError:
        return "the repair reason is not valid Unicode text"
    if size > MAX_REASON_BYTES:
        return f"the repair reason is {size} bytes; the limit is {MAX_REASON_BYTES} bytes"
    return None


def repair_problem(record: RepairRecord, partition_key: bytes | None) -> str | None:
    """Why a repair record is unsound on its own (before any source is consulted), or ``None``."""
    problem = verify_repair(record)
    if problem is not None:
        return problem
    if partition_key is not None and partition_key != record.project_sha256:
        return "record's project does not match its partition key"
    return None


@dataclass(frozen=True, slots=True)
class RepairOutcome:
    """What applying one sound repair record does to its source.

    ``cleared``: the broken mark was lifted. ``marked``: how many quarantined records it marks repaired.
    """

    status: str
    cleared: bool
    marked: int


def decide_repair(*, known: bool, broken: bool, unrepaired: int) -> RepairOutcome:
    """The outcome of a repair of a source (the one decision the in-memory fold and the store share).

    ``known``: the projection holds the source under the repair's project (some record of it was
    folded). ``broken``: it carries a broken mark. ``unrepaired``: its quarantined records on the
    repair's partition, below the repair's offset, that no repair marked yet. A broken source always
    has at least one (the record that broke it).
    """
    if unrepaired > 0 or broken:
        return RepairOutcome(REPAIRED, broken, unrepaired)
    return RepairOutcome(NOT_BROKEN if known else UNKNOWN_SOURCE, False, 0)
