"""The oracle's model: what every read of a series must return, computed from plain lists.

This module imports the standard library only (``test_model_imports_nothing_of_production`` enforces
it). It re-derives, from the documented canonical forms, everything it needs:

- project hash ``SHA-256(UTF-8(name))`` (the model's project names are ASCII words, canonical as they are);
- source hash ``SHA-256("throughline.source.v1\\0" || project_sha256 || u64be(len host) || host ||
  u64be(len thread) || thread)`` (docs/design.md, Identity);
- content and chain digests (``throughline/core/chain.py``'s docstring);
- cursor strings ``"tlc1." + base64url(project || source || u64 length || chain digest || u32 partition ||
  u64 offset)`` (``throughline/core/cursor.py``'s docstring).

The state is a list of log records, an applied-record counter (the projector's lag) and how far the
projector's fetches reach (records fetched but not applied yet, whose projects it knows). A project's
chains are the fold of the applied records: per project a dict of sources, each a plain list of turns,
the head source, and the broken sources (a turn that leaves a gap breaks its source; a repair record
mends it; docs/operations.md). The expected answer of a read follows docs/spec.md#read-contract and #freshness and the
order of checks in the reader's algorithm (docs/oracle.md, "The model").
"""

from __future__ import annotations

import base64
import hashlib
import struct
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

PROJECTS = ("alpha", "beta")
HOSTS = ("h1", "h2")
THREADS = ("t1", "t2")
SOURCES = tuple((h, t) for h in HOSTS for t in THREADS)
PARTITION = 0  # one partition holds both projects, so one project's lag is the other's too
READ_SCHEMA = "throughline.observer_read.v1"

OK = "ok"
PENDING = "projection_pending"
RESYNC = "resync_required"
ERROR = "error"
QUARANTINED = "source_quarantined"

_EPOCH_MICROS = 1_784_000_000_123_456  # mid-2026, with a fraction so completedAt prints all six digits
_CHAIN_ORIGIN = hashlib.sha256(b"throughline.chain.v1").digest()


def _u64(n: int) -> bytes:
    return n.to_bytes(8, "big")


def project_hash(project: str) -> bytes:
    """SHA-256 of the project's UTF-8 name (ASCII names are canonical as they are)."""
    return hashlib.sha256(project.encode("utf-8")).digest()


def source_hash(project: str, host: str, thread: str) -> bytes:
    """The hash-only identity of (host, thread) within ``project``."""
    h, t = host.encode("utf-8"), thread.encode("utf-8")
    return hashlib.sha256(
        b"throughline.source.v1\x00" + project_hash(project) + _u64(len(h)) + h + _u64(len(t)) + t
    ).digest()


def content_digest(turn_id: str, micros: int, body: str) -> bytes:
    """The v1 canonical content digest of one turn."""
    tid, text = turn_id.encode("utf-8"), body.encode("utf-8")
    return hashlib.sha256(
        b"throughline.turn.v1\x00"
        + _u64(len(tid))
        + tid
        + micros.to_bytes(8, "big", signed=True)
        + _u64(len(text))
        + text
    ).digest()


def format_micros(micros: int) -> str:
    """``YYYY-MM-DDTHH:MM:SS.ffffffZ`` in UTC."""
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def cut_body(body: str, limit: int) -> tuple[str, bool]:
    """The body cut to at most ``limit`` UTF-8 bytes at a character boundary, and whether it was cut."""
    raw = body.encode("utf-8")
    if len(raw) <= limit:
        return body, False
    return raw[:limit].decode("utf-8", "ignore"), True


@dataclass(frozen=True)
class Record:
    """One record of the model's log (one partition): a completed turn as a host appended it."""

    offset: int
    project: str
    host: str
    thread: str
    turn_id: str
    seq: int | None
    micros: int
    body: str
    kind: str = "turn"  # or "repair": an operator's repair of (host, thread), ``body`` its reason


@dataclass(frozen=True)
class Turn:
    """A live turn of a chain."""

    seq: int
    turn_id: str
    micros: int
    body: str
    content: bytes
    chain: bytes
    offset: int


@dataclass(frozen=True)
class Prefix:
    """What a cursor string means to the model: a prefix of one source's chain and its log position."""

    project: str
    host: str
    thread: str
    length: int
    chain: bytes
    offset: int

    @property
    def source(self) -> tuple[str, str]:
        """(host, thread)."""
        return (self.host, self.thread)

    @property
    def text(self) -> str:
        """The cursor string, per the documented layout."""
        payload = struct.pack(
            ">32s32sQ32sIQ",
            project_hash(self.project),
            source_hash(self.project, self.host, self.thread),
            self.length,
            self.chain,
            PARTITION,
            self.offset,
        )
        return "tlc1." + base64.urlsafe_b64encode(payload).rstrip(b"=").decode("ascii")


@dataclass
class State:
    """The fold of a log prefix: per project, its sources' chains, its head source and the broken sources.

    A turn whose seq leaves a gap does not enter its chain and breaks its source (the chain is kept,
    perhaps empty); a repair record mends a broken source; nothing else changes either.
    """

    chains: dict[tuple[str, str, str], list[Turn]] = field(default_factory=dict)
    heads: dict[str, tuple[str, str]] = field(default_factory=dict)
    broken: set[tuple[str, str, str]] = field(default_factory=set)

    def chain(self, project: str, source: tuple[str, str]) -> list[Turn] | None:
        """The live chain of a source, or ``None`` when no record of it was folded."""
        return self.chains.get((project, *source))

    def sources(self, project: str) -> list[tuple[str, str]]:
        """The project's sources with at least one turn, in the fixed order of ``SOURCES``."""
        return [s for s in SOURCES if self.chains.get((project, *s))]


@dataclass(frozen=True)
class Expect:
    """What the model says one read call must return.

    ``status`` is a read status, or ``"error"`` with ``error_code``. For ``ok`` every field is exact.
    For the other statuses ``through_text`` is the echo the call must carry; ``through_either`` lists
    the values accepted when the model does not pin the echo (a resync on a first page, after the
    reader pinned the head).
    """

    status: str
    reason: str
    after_text: str | None = None
    through_text: str | None = None
    through_either: tuple[str | None, ...] = ()
    through: Prefix | None = None
    source_sha256_hex: str | None = None
    turns: tuple[dict[str, object], ...] = ()
    history_truncated: bool = False
    complete: bool = False
    has_token: bool = False
    error_code: str | None = None
    page: tuple[int, int] = (0, 0)  # (page_start, page_end] of the through source, for messages
    scoped: bool = False  # settled although records of other projects below the bound were not applied


@dataclass
class Model:
    """The log, the projector's applied and fetched counters and the row faults the test injected."""

    records: list[Record] = field(default_factory=list)
    applied: int = 0
    fetched: int = 0  # how far the projector's fetches reach (records fetched, not all applied yet)
    hidden: set[tuple[str, str, str, int]] = field(default_factory=set)
    altered: set[tuple[str, str, str, int]] = field(default_factory=set)
    cursors: dict[str, Prefix] = field(default_factory=dict)
    mended: dict[tuple[str, str, str], int] = field(default_factory=dict)  # source -> offset of its first mend
    _states: dict[int, State] = field(default_factory=dict)
    _offsets: dict[bytes, int] = field(default_factory=dict)  # chain digest -> log offset, every turn ever

    # ------------------------------------------------------------------------------------- history

    def append(self, project: str, host: str, thread: str, seq: int | None, body: str) -> Record:
        """A host completes a turn (``seq`` at or below the chain's length rewinds it, above length + 1
        leaves a gap)."""
        offset = len(self.records)
        record = Record(offset, project, host, thread, f"turn-{offset}", seq, _EPOCH_MICROS + offset * 1_000_003, body)
        self.records.append(record)
        return record

    def append_repair(self, project: str, host: str, thread: str, reason: str) -> Record:
        """An operator repairs the source (host, thread) of ``project`` (whether it is broken or not)."""
        offset = len(self.records)
        record = Record(offset, project, host, thread, f"repair-{offset}", None, 0, reason, kind="repair")
        self.records.append(record)
        return record

    def apply(self, count: int | None) -> int:
        """The projector applies ``count`` pending records (all when ``None``); returns how many."""
        pending = len(self.records) - self.applied
        n = pending if count is None else max(0, min(count, pending))
        self.applied += n
        return n

    def fetch(self, count: int | None) -> tuple[int, int]:
        """The projector fetches ``count`` more records (all when ``None``) without applying them yet;
        returns the offsets fetched, ``(first, end)``."""
        first = max(self.fetched, self.applied)
        end = len(self.records) if count is None else min(len(self.records), first + max(0, count))
        self.fetched = max(first, end)
        return first, self.fetched

    def settled(self, project: str, below: int) -> bool:
        """Every record of ``project`` below ``below`` is applied, provably (docs/spec.md#scoped-wait): the
        applied count reaches ``below``, or the fetches do and no record in between is the project's."""
        if self.applied >= below:
            return True
        if max(self.fetched, self.applied) < below:
            return False
        return all(r.project != project for r in self.records[self.applied : below])

    @property
    def log_end(self) -> int:
        """The partition's end offset."""
        return len(self.records)

    def state(self, n: int) -> State:
        """The fold of the first ``n`` records."""
        cached = self._states.get(n)
        if cached is not None:
            return cached
        base_n = max((k for k in self._states if k < n), default=0)
        base = self._states.get(base_n)
        st = (
            State({k: list(v) for k, v in base.chains.items()}, dict(base.heads), set(base.broken)) if base else State()
        )
        for record in self.records[base_n:n]:
            key = (record.project, record.host, record.thread)
            if record.kind == "repair":
                if key in st.broken:
                    st.broken.discard(key)
                    self.mended.setdefault(key, record.offset)
                continue
            chain = st.chains.setdefault(key, [])
            seq = len(chain) + 1 if record.seq is None else record.seq
            if seq > len(chain) + 1:  # a gap: the turn never enters the chain
                st.broken.add(key)
                continue
            previous = _CHAIN_ORIGIN if seq == 1 else chain[seq - 2].chain
            content = content_digest(record.turn_id, record.micros, record.body)
            digest = hashlib.sha256(previous + content).digest()
            del chain[seq - 1 :]
            chain.append(Turn(seq, record.turn_id, record.micros, record.body, content, digest, record.offset))
            self._offsets[digest] = record.offset
            st.heads[record.project] = (record.host, record.thread)
        self._states[n] = st
        return st

    @property
    def log_state(self) -> State:
        """The chains as the hosts know them (every appended record)."""
        return self.state(len(self.records))

    @property
    def applied_state(self) -> State:
        """The chains as the projection must hold them."""
        return self.state(self.applied)

    # --------------------------------------------------------------------------------------- cursors

    def register(self, prefix: Prefix) -> str:
        """The cursor string of ``prefix``; remembered so the model can read it back."""
        text = prefix.text
        self.cursors[text] = prefix
        return text

    def prefix_of(self, state: State, project: str, source: tuple[str, str], length: int) -> Prefix:
        """The prefix of ``length`` turns of a source's chain in ``state``."""
        chain = state.chain(project, source)
        assert chain is not None and 1 <= length <= len(chain)
        turn = chain[length - 1]
        return Prefix(project, source[0], source[1], length, turn.chain, turn.offset)

    def head_of(self, state: State, project: str) -> Prefix | None:
        """The project's head source's full chain, or ``None`` with no turns."""
        source = state.heads.get(project)
        if source is None:
            return None
        return self.prefix_of(state, project, source, len(state.chain(project, source) or []))

    def forged(self, prefix: Prefix) -> Prefix:
        """A well-formed cursor naming a prefix no chain has (its chain digest flipped)."""
        return replace(prefix, chain=bytes([prefix.chain[0] ^ 0xFF]) + prefix.chain[1:])

    def offset_of_chain(self, chain_hex: str) -> int | None:
        """The log offset of the record that made the turn with this chain digest (``None``: no such turn)."""
        try:
            return self._offsets.get(bytes.fromhex(chain_hex))
        except ValueError:
            return None

    # ------------------------------------------------------------------------------------ expectation

    def wire_turn(self, turn: Turn, body_limit: int) -> dict[str, object]:
        """The wire form of one turn."""
        body, cut = cut_body(turn.body, body_limit)
        return {
            "seq": turn.seq,
            "completedAt": format_micros(turn.micros),
            "body": body,
            "bodyBytes": len(turn.body.encode("utf-8")),
            "bodyTruncated": cut,
            "contentDigest": turn.content.hex(),
            "chainDigest": turn.chain.hex(),
        }

    def expect_read(
        self,
        project: str,
        after: str | None,
        through: str | None,
        offset: int | None,
        limit: int,
        body_limit: int,
    ) -> Expect:
        """What ``read_observer_turn_page`` must return for this call now (no page token problems)."""
        a = None if after is None else self.cursors[after]
        t = None if through is None else self.cursors[through]

        def echo(status: str, reason: str) -> Expect:
            return Expect(status, reason, after_text=after, through_text=through)

        for c in (a, t):
            if c is not None and c.project != project:
                return echo(RESYNC, "a cursor names another project")
        for c in (a, t):
            if c is not None and c.offset >= self.log_end:
                return echo(RESYNC, "a cursor names a log position the log does not hold")

        bound = self.log_end if t is None else max(t.offset, a.offset if a is not None else -1) + 1
        scoped = self.applied < bound
        if t is None:
            if not self.settled(project, self.log_end):
                return echo(
                    PENDING,
                    f"first page: {project}'s records below log end {self.log_end} are not all "
                    f"provably applied (applied {self.applied}, fetched {self.fetched})",
                )
            state = self.applied_state
            t = self.head_of(state, project)
            if t is None:
                if a is not None:
                    return echo(RESYNC, "first page: the project has no head but an after cursor")
                return Expect(OK, "first contact with an empty project", after_text=after, complete=True, scoped=scoped)
            self.register(t)
            pinned: tuple[str | None, ...] = (None, t.text)
        else:
            need = max(t.offset, a.offset if a is not None else -1) + 1
            if not self.settled(project, need):
                return echo(
                    PENDING,
                    f"{project}'s records below cursor position {need} are not all provably "
                    f"applied (applied {self.applied}, fetched {self.fetched})",
                )
            state = self.applied_state
            pinned = (through,)

        def refused(status: str, reason: str) -> Expect:
            return Expect(status, reason, after_text=after, through_text=through, through_either=pinned)

        for name, c in (("through", t), ("after", a)):
            if c is None:
                continue
            chain = state.chain(project, c.source)
            if chain is None:
                return refused(RESYNC, f"{name}: its source is not in the projection")
            if (project, *c.source) in state.broken:
                return Expect(
                    ERROR,
                    f"{name}: its source is broken (a quarantined record, not repaired)",
                    after_text=after,
                    through_text=through,
                    through_either=pinned,
                    error_code=QUARANTINED,
                )
            if len(chain) < c.length:
                return refused(RESYNC, f"{name}: the chain is now shorter ({len(chain)} < {c.length})")
            if (project, *c.source, c.length) in self.hidden:
                return refused(PENDING, f"{name}: the projection lacks row {c.length}")
            row = chain[c.length - 1]
            if row.chain != c.chain or row.offset != c.offset:
                return refused(RESYNC, f"{name}: seq {c.length} was rolled back and replaced")

        chain = state.chain(project, t.source) or []
        if a is None:
            start = max(0, t.length - limit)
            page_start, page_end, truncated, next_offset = start, t.length, start > 0, None
        else:
            if a.source == t.source:
                if t.length < a.length:
                    return refused(RESYNC, "through is behind after on the same source")
                start = a.length
            else:
                start = 0
            page_start = start + (offset or 0)
            assert page_start < t.length or (offset or 0) == 0, "the driver only follows issued tokens"
            page_end = min(t.length, page_start + limit)
            truncated, next_offset = False, (None if page_end >= t.length else page_end - start)

        if page_start > 0 and (project, *t.source, page_start) in self.hidden:
            return refused(PENDING, f"the projection lacks row {page_start} (the page's chain link)")
        for seq in range(page_start + 1, page_end + 1):
            if (project, *t.source, seq) in self.hidden:
                return refused(PENDING, f"the projection lacks row {seq} of the page")
            if (project, *t.source, seq) in self.altered:
                return refused(PENDING, f"the projection's row {seq} disagrees with its digest")

        return Expect(
            OK,
            f"page ({page_start}, {page_end}] of range ({start}, {t.length}]",
            after_text=after,
            through_text=t.text,
            through=t,
            source_sha256_hex=source_hash(project, *t.source).hex(),
            turns=tuple(self.wire_turn(turn, body_limit) for turn in chain[page_start:page_end]),
            history_truncated=truncated,
            complete=next_offset is None,
            has_token=next_offset is not None,
            page=(page_start, page_end),
            scoped=scoped,
        )

    def series_range(
        self, project: str, after: str | None, through: str, limit: int, body_limit: int
    ) -> list[dict[str, object]]:
        """Every turn a completed series must have delivered, in order (from the applied state)."""
        a = None if after is None else self.cursors[after]
        t = self.cursors[through]
        chain = self.applied_state.chain(project, t.source) or []
        if a is None:
            start = max(0, t.length - limit)
        elif a.source == t.source:
            start = a.length
        else:
            start = 0
        return [self.wire_turn(turn, body_limit) for turn in chain[start : t.length]]
