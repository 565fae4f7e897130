"""The fold: how one turn record changes its source's chain (pure; no Kafka, no DuckDB).

For a record of source S whose chain has length ``n`` and head digest ``d(n)``:

1. The record is refused (``Reject``) when it is unsound: not canonical, a content digest that does
   not match its content, or a project that does not match the partition key it was written under.
2. A turn id S has applied before (``Placement``: the seq ``p`` it was last placed at, its content
   then, and whether it is still live there). A turn's identity does not change when a newer parser
   reads the same transcript again, so what differs corrects the chain instead of being refused:

   - live at ``p``: a seq below ``p`` places it there (rule 4: the turns from that seq on are
     superseded, the one at ``p`` too); otherwise the same content is a ``Duplicate`` (a later seq
     too: a turn before it was not sent yet, it stays) and other content *amends* it (``Amend``): turn
     ``p`` takes the record's content, the turns after it stay, chained anew (a rewind to ``p`` for a
     reader whose cursor was past it);
   - superseded since: no seq is a stale re-send, a ``Duplicate`` whatever its content; seq ``p`` too
     (a host rewind left it: the turns that superseded it completed after it) unless its ``completedAt``
     is later than the head's (a newer parser found turns before it, which superseded it), and then it
     is placed as rules 3-5 place a new turn; another seq places it so too. This takes a host's
     ``completedAt`` to grow along its turns: where its clock stepped back across a rewind, a re-send
     of the turns the rewind left places them again (docs/design.md, the upgrade rule's known limits).

3. No seq, or ``seq == n + 1``: ``Append`` at ``n + 1``.
4. ``seq <= n`` (a rollback): turns ``seq..n`` are superseded (kept for audit, never served) and the
   record becomes turn ``seq``, chained onto ``d(seq - 1)``.
5. ``seq > n + 1``: ``Reject`` (a gap).

Every ``Append`` and ``Amend`` makes S its project's head source. A rejected record marks S *broken*
(the reader refuses to serve it) but does not stop the fold: later records of S are folded by the same
rules. A repair record (``throughline.core.repair``) lifts the mark. ``ChainBook`` is the in-memory fold
over whole histories, repairs included; the DuckDB projection applies the same decisions in bulk. What
a rewind or an amend supersedes is ``throughline.core.chain_delta.ChainDelta``'s to decide, in both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple, Protocol, TypeVar

from throughline.core.chain import CHAIN_ORIGIN, next_chain_digest
from throughline.core.chain_delta import ChainDelta
from throughline.core.repair import RepairOutcome, RepairRecord, decide_repair, repair_problem
from throughline.core.turn import TurnRecord, verify_turn

R = TypeVar("R")


class ChainLink(Protocol):
    """What the fold reads of a record: a ``TurnRecord``, or the projector's flat ``SoundRecord``."""

    @property
    def seq(self) -> int | None: ...
    @property
    def content_digest(self) -> bytes: ...
    @property
    def completed_at_micros(self) -> int: ...


class HeadLike(Protocol):
    """What the fold reads of a chain's head: a ``ChainHead``, or the projector's source state."""

    @property
    def length(self) -> int: ...
    @property
    def chain_digest(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class ChainHead:
    """A source's chain at one moment: its length and ``d(length)``."""

    length: int = 0
    chain_digest: bytes = CHAIN_ORIGIN


class Append(NamedTuple):
    """The record becomes turn ``seq``; turns ``seq..previous length`` are superseded when rewinding.

    A tuple rather than a frozen dataclass: the projector folds every record it reads, and almost every
    outcome is an ``Append`` (built at a third of the cost).
    """

    seq: int
    chain_digest: bytes
    rewound_from: int | None  # previous length when this append rewinds the chain, else None

    @property
    def is_rewind(self) -> bool:
        """True when the append replaced later turns."""
        return self.rewound_from is not None


class Amend(NamedTuple):
    """The record replaces live turn ``seq`` (its turn id was placed there with other content); turns
    ``seq + 1..rewound_from`` stay, chained anew after it (``chain_digest`` is the new ``d(seq)``)."""

    seq: int
    chain_digest: bytes
    rewound_from: int  # the chain's length (it stays)

    @property
    def is_rewind(self) -> bool:
        """Always: for a reader, the chain from ``seq`` on changed."""
        return True


class Placement(NamedTuple):
    """Where a source last placed a turn id (appended, or amended in place): its seq then, its content
    digest then, and whether the turn is live there now (not superseded since)."""

    seq: int
    content_digest: bytes
    live: bool


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The same turn was applied before; nothing changes."""


@dataclass(frozen=True, slots=True)
class Reject:
    """The record cannot enter the chain; it is quarantined with ``reason``."""

    reason: str


Outcome = Append | Amend | Duplicate | Reject


def record_problem(record: TurnRecord, partition_key: bytes | None) -> str | None:
    """Why a decoded record is unsound on its own (before any chain is consulted), or ``None``."""
    return verify_turn(record) or partition_key_problem(record.project_sha256, partition_key)


def partition_key_problem(project_hash: bytes, partition_key: bytes | None) -> str | None:
    """Why a record of project ``project_hash`` must not be under ``partition_key``, or ``None``."""
    if partition_key is not None and partition_key != project_hash:
        return "record's project does not match its partition key"
    return None


def fold_turn(
    head: HeadLike,
    record: ChainLink,
    *,
    applied: Placement | None,
    digest_at: Callable[[int], bytes],
    completed_at: Callable[[int], int],
) -> Outcome:
    """Decide what ``record`` does to a chain whose current head is ``head``.

    ``applied`` is where this source last placed the record's turn id (``None`` if never: the usual
    case, decided without another look-up); ``digest_at(k)`` returns ``d(k)`` of the live chain for
    ``0 < k <= length`` (only called when rewinding or amending), ``completed_at(k)`` the ``completedAt``
    of its turn ``k`` (only called for a superseded turn id re-sent at the seq it was placed at).
    """
    seq = record.seq
    if applied is not None:
        if applied.live:
            if seq is None or seq >= applied.seq:
                if applied.content_digest == record.content_digest:
                    return Duplicate()
                p = applied.seq
                base = CHAIN_ORIGIN if p == 1 else digest_at(p - 1)
                return Amend(p, next_chain_digest(base, record.content_digest), head.length)
            # seq < p: a turn before it is gone; placed at seq below (a rewind over p).
        elif seq is None or seq == applied.seq:
            # A host rewind supersedes a turn by turns completed after it, so a re-send of one it left
            # is never later than the head (a stale re-send). Later, the turns that superseded it came
            # before it on the host: a newer parser found them, and it is placed again (as a new turn).
            if seq is None or (head.length and record.completed_at_micros <= completed_at(head.length)):
                return Duplicate()
    if seq is None or seq == head.length + 1:
        return Append(head.length + 1, next_chain_digest(head.chain_digest, record.content_digest), None)
    if seq > head.length + 1:
        return Reject(f"seq {seq} leaves a gap after length {head.length}")
    base = CHAIN_ORIGIN if seq == 1 else digest_at(seq - 1)
    return Append(seq, next_chain_digest(base, record.content_digest), head.length)


def rechain(
    digest: bytes, rows: Sequence[R], content_of: Callable[[R], bytes], chained: Callable[[R, bytes], R]
) -> list[R]:
    """The kept turns after an ``Amend`` (``rows``, in seq order) chained anew onto ``digest`` (the
    amended turn's): ``chained(row, d)`` is ``row`` with chain digest ``d``."""
    out: list[R] = []
    for row in rows:
        digest = next_chain_digest(digest, content_of(row))
        out.append(chained(row, digest))
    return out


@dataclass(frozen=True, slots=True)
class BookTurn:
    """A turn in the in-memory book."""

    seq: int
    turn_id: str
    content_digest: bytes
    chain_digest: bytes
    partition: int
    offset: int
    record: TurnRecord


@dataclass(frozen=True, slots=True)
class BookRepair:
    """A sound repair record the book applied: where it is, what it repaired, and the chain it accepted."""

    partition: int
    offset: int
    project_sha256: bytes
    source_sha256: bytes
    reason: str
    outcome: RepairOutcome
    length: int  # the source's chain as applied when the repair was applied
    chain_digest: bytes


Position = tuple[int, int]  # (partition, offset) of a log record


def _book_turn_digest(turn: BookTurn) -> bytes:
    return turn.chain_digest


def _book_turn_content(turn: BookTurn) -> bytes:
    return turn.content_digest


def _book_turn_chained(turn: BookTurn, digest: bytes) -> BookTurn:
    return replace(turn, chain_digest=digest)


@dataclass
class ChainBook:
    """An in-memory fold over whole histories (the reference the DuckDB projection must agree with).

    ``quarantined`` lists (partition, offset, reason) in fold order; ``quarantine_identity`` gives the
    (project, source) of those whose record decoded far enough to name them; ``repaired`` maps a
    quarantined position to the position of the repair that marked it; ``broken`` holds the sources
    with a rejected record no repair has marked.
    """

    live: dict[bytes, list[BookTurn]] = field(default_factory=dict)
    #: source -> turn id -> (seq, content digest) where it was last placed.
    applied: dict[bytes, dict[str, tuple[int, bytes]]] = field(default_factory=dict)
    superseded: list[BookTurn] = field(default_factory=list)
    heads: dict[bytes, bytes] = field(default_factory=dict)
    quarantined: list[tuple[int, int, str]] = field(default_factory=list)
    broken: set[bytes] = field(default_factory=set)
    source_projects: dict[bytes, bytes] = field(default_factory=dict)
    quarantine_identity: dict[Position, tuple[bytes, bytes | None]] = field(default_factory=dict)
    repaired: dict[Position, Position] = field(default_factory=dict)
    repairs: list[BookRepair] = field(default_factory=list)

    def head_of(self, source: bytes) -> ChainHead:
        """The current head of a source's chain."""
        turns = self.live.get(source)
        if not turns:
            return ChainHead()
        return ChainHead(turns[-1].seq, turns[-1].chain_digest)

    def _quarantine(
        self, partition: int, offset: int, reason: str, project_sha256: bytes, source: bytes | None
    ) -> None:
        self.quarantined.append((partition, offset, reason))
        self.quarantine_identity[(partition, offset)] = (project_sha256, source)

    def apply(self, record: TurnRecord, partition: int, offset: int, partition_key: bytes | None = None) -> Outcome:
        """Fold one record at log position (partition, offset)."""
        problem = record_problem(record, partition_key)
        if problem is not None:
            try:
                identity: bytes | None = record.source_sha256
            except Exception:  # an unencodable host or thread: quarantined without a source hash
                identity = None
            self._quarantine(partition, offset, problem, record.project_sha256, identity)
            return Reject(problem)
        source = record.source_sha256
        self.source_projects.setdefault(source, record.project_sha256)
        turns = self.live.setdefault(source, [])
        # The book holds the whole chain as the delta's pending rows: nothing is stored beneath it.
        delta = ChainDelta(0, _book_turn_digest, pending=turns)
        seen = self.applied.setdefault(source, {})
        placed = seen.get(record.turn_id)
        placement = None
        if placed is not None:
            p, content = placed
            placement = Placement(p, content, p <= len(turns) and turns[p - 1].turn_id == record.turn_id)
        outcome = fold_turn(
            self.head_of(source),
            record,
            applied=placement,
            digest_at=delta.digest_at,
            completed_at=lambda k: turns[k - 1].record.completed_at_micros,
        )
        if isinstance(outcome, Reject):
            self._quarantine(partition, offset, outcome.reason, record.project_sha256, source)
            self.broken.add(source)
        elif isinstance(outcome, Duplicate):
            pass
        else:
            kept: list[BookTurn] = []
            if isinstance(outcome, Amend):
                gone, kept = delta.amend(outcome.seq, partition, offset)
                self.superseded.extend(gone)
            elif outcome.is_rewind:
                self.superseded.extend(delta.rewind(outcome.seq, partition, offset))
            turns.append(
                BookTurn(
                    outcome.seq, record.turn_id, record.content_digest, outcome.chain_digest, partition, offset, record
                )
            )
            if kept:
                turns.extend(rechain(outcome.chain_digest, kept, _book_turn_content, _book_turn_chained))
            seen[record.turn_id] = (outcome.seq, record.content_digest)
            self.heads[record.project_sha256] = source
        return outcome

    def apply_repair(
        self, record: RepairRecord, partition: int, offset: int, partition_key: bytes | None = None
    ) -> RepairOutcome | Reject:
        """Apply one repair record at log position (partition, offset) (``throughline.core.repair``).

        An unsound record is quarantined (``Reject``) and changes nothing else. A sound one marks the
        source's unmarked quarantined records on ``partition`` below ``offset`` repaired by this
        position and lifts the source's broken mark; its chain, head and applied turn ids stay as they
        are, so the next turn with seq = length + 1 appends.
        """
        problem = repair_problem(record, partition_key)
        if problem is not None:
            self._quarantine(partition, offset, problem, record.project_sha256, record.source_sha256)
            return Reject(problem)
        source, project = record.source_sha256, record.project_sha256
        pending = [
            position
            for position, (p, s) in self.quarantine_identity.items()
            if s == source
            and p == project
            and position[0] == partition
            and position[1] < offset
            and position not in self.repaired
        ]
        known = self.source_projects.get(source) == project
        outcome = decide_repair(known=known, broken=known and source in self.broken, unrepaired=len(pending))
        for position in pending:
            self.repaired[position] = (partition, offset)
        if outcome.cleared:
            self.broken.discard(source)
        head = self.head_of(source) if known else ChainHead()  # a foreign source's chain is not this project's
        self.repairs.append(
            BookRepair(partition, offset, project, source, record.reason, outcome, head.length, head.chain_digest)
        )
        return outcome

    def apply_record(
        self, record: TurnRecord | RepairRecord, partition: int, offset: int, partition_key: bytes | None = None
    ) -> Outcome | RepairOutcome:
        """Fold a decoded log record of either family (``apply`` or ``apply_repair``)."""
        if isinstance(record, RepairRecord):
            return self.apply_repair(record, partition, offset, partition_key)
        return self.apply(record, partition, offset, partition_key)

    def apply_all(self, records: Iterable[tuple[TurnRecord | RepairRecord, int, int]]) -> None:
        """Fold (record, partition, offset) triples in order (turns and repairs)."""
        for record, partition, offset in records:
            self.apply_record(record, partition, offset)
