"""The oracle's laws: compare what production returned with what the model expects.

Every violation is an ``AssertionError`` whose message starts with ``oracle law [NAME]`` (the names are
the rows of docs/oracle.md's ownership table). The checker reads wire documents (plain dicts, the
``throughline.observer_read.v1`` JSON) and the model's ``Expect`` values only; like the model, it imports
nothing of production (``test_model_imports_nothing_of_production`` enforces it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .model import ERROR, OK, PENDING, QUARANTINED, READ_SCHEMA, RESYNC, Expect, Model

SERIES_EXACT = "series-exact"
PINNED_THROUGH = "pinned-through"
REREAD_IDENTICAL = "reread-identical"
TOKEN_BINDING = "token-binding"
PENDING_HONESTY = "pending-honesty"
RESYNC_EXACT = "resync-exact"
SNAPSHOT = "snapshot"
QUARANTINE_EXACT = "quarantine-exact"
WIRE = "wire"
TURN_FIELDS = ("seq", "completedAt", "body", "bodyBytes", "bodyTruncated", "contentDigest", "chainDigest")


@dataclass(frozen=True)
class Outcome:
    """What one production call did: a wire document, or a throughline error with its code."""

    wire: dict[str, Any] | None = None
    error_code: str | None = None
    error_type: str | None = None
    crashed: bool = False  # the reader raised something that is not a throughline error

    def describe(self) -> str:
        """A short account for messages."""
        if self.crashed:
            return f"crashed with {self.error_type}"
        if self.wire is None:
            return f"raised {self.error_type} (code {self.error_code})"
        page = self.wire.get("page") or {}
        return (
            f"status {self.wire.get('status')!r} with {len(self.wire.get('turns') or [])} turns "
            f"{[t.get('seq') for t in self.wire.get('turns') or []]}, complete={page.get('complete')}, "
            f"token={'yes' if page.get('nextToken') else 'no'}"
        )


def fail(law: str, detail: str) -> None:
    """Raise the violation of ``law``."""
    raise AssertionError(f"oracle law [{law}] violated: {detail}")


def _status_law(expected: str, actual: object) -> str:
    if PENDING in (expected, actual):
        return PENDING_HONESTY
    if RESYNC in (expected, actual):
        return RESYNC_EXACT
    return WIRE


def check_read(
    model: Model, expect: Expect, outcome: Outcome, *, context: str, snapshot: bool, pin_end: int | None = None
) -> None:
    """One call against the model's expectation (status, echo, rows, page, token presence)."""
    where = f"{context}: model expects {expect.status} ({expect.reason}); production {outcome.describe()}"
    if expect.status == ERROR or outcome.error_code == QUARANTINED:
        # A broken source is never served, and a mended one is served again (then by the laws below).
        if outcome.error_code != expect.error_code:
            fail(QUARANTINE_EXACT, where)
        return
    if outcome.wire is None:
        law = TOKEN_BINDING if (outcome.error_code or "").startswith("page_token") else _status_law(expect.status, None)
        fail(law, where)
        return
    wire = outcome.wire
    if wire.get("schema") != READ_SCHEMA:
        fail(WIRE, f"{where}; schema is {wire.get('schema')!r}")
    status = wire.get("status")
    if status != expect.status:
        fail(_status_law(expect.status, status), where)
    page = wire.get("page") or {}
    if wire.get("afterCursor") != expect.after_text:
        fail(WIRE, f"{where}; afterCursor is not the after cursor the caller sent")
    if status != OK:
        accepted = expect.through_either or (expect.through_text,)
        if wire.get("throughCursor") not in accepted:
            fail(WIRE, f"{where}; throughCursor {wire.get('throughCursor')!r} is not an echo of the call")
        if (
            wire.get("turns")
            or page.get("nextToken") is not None
            or page.get("complete") is not False
            or wire.get("historyTruncated") is not False
        ):
            law = PENDING_HONESTY if status == PENDING else RESYNC_EXACT
            fail(law, f"{where}; a {status} answer must carry no turns, no token, complete=false")
        return

    if wire.get("throughCursor") != expect.through_text:
        fail(PINNED_THROUGH, f"{where}; throughCursor is not the through cursor the model pinned")
    thread = wire.get("thread")
    want_thread = None if expect.source_sha256_hex is None else {"sourceSha256": expect.source_sha256_hex}
    if thread != want_thread:
        fail(WIRE, f"{where}; thread {thread!r} is not {want_thread!r}")
    turns = wire.get("turns") or []
    bound = expect.through.offset if expect.through is not None else None
    for turn in turns:
        made_at = model.offset_of_chain(str(turn.get("chainDigest")))
        if made_at is None:
            fail(SERIES_EXACT, f"{where}; turn seq {turn.get('seq')} is no turn the hosts completed")
        elif (
            bound is not None and made_at > bound or pin_end is not None and made_at is not None and made_at >= pin_end
        ):
            fail(
                PINNED_THROUGH,
                f"{where}; turn seq {turn.get('seq')} (log offset {made_at}) completed after "
                f"the through cursor (offset {bound}, pinned at log end {pin_end})",
            )
    _compare_turns(turns, expect.turns, SNAPSHOT if snapshot else SERIES_EXACT, where)
    if wire.get("historyTruncated") is not expect.history_truncated:
        fail(SNAPSHOT if snapshot else WIRE, f"{where}; historyTruncated is {wire.get('historyTruncated')!r}")
    if page.get("complete") is not expect.complete or (page.get("nextToken") is not None) != expect.has_token:
        fail(
            SERIES_EXACT,
            f"{where}; the model's page is {expect.page} (complete={expect.complete}, "
            f"token={'yes' if expect.has_token else 'no'})",
        )


def _compare_turns(
    actual: Sequence[dict[str, Any]], expected: Sequence[dict[str, object]], law: str, where: str
) -> None:
    got = [{k: t.get(k) for k in TURN_FIELDS} for t in actual]
    want = list(expected)
    if got == want:
        return
    seqs = [t["seq"] for t in got]
    if len(set(seqs)) != len(seqs):
        fail(law, f"{where}; duplicate seqs {seqs}")
    if [t["seq"] for t in want] != seqs:
        fail(law, f"{where}; seqs {seqs}, the model's are {[t['seq'] for t in want]} (gap or order)")
    for g, w in zip(got, want, strict=True):
        if g != w:
            diff = {k: (g[k], w[k]) for k in TURN_FIELDS if g[k] != w[k]}
            fail(law, f"{where}; turn seq {g['seq']} differs from the model's (got, want): {diff}")


def check_series_complete(
    pages: Sequence[dict[str, Any]], expected: Sequence[dict[str, object]], *, context: str, snapshot: bool
) -> None:
    """A completed series' pages, concatenated, are exactly the model's range."""
    turns = [t for page in pages for t in page.get("turns") or []]
    where = f"{context}: the {len(pages)} pages of the completed series"
    _compare_turns(turns, expected, SNAPSHOT if snapshot else SERIES_EXACT, where)


def check_reread(first: dict[str, Any], outcome: Outcome, expect: Expect, *, context: str) -> None:
    """A page read again (model says ok) is identical to its first reading."""
    if expect.status == OK and outcome.wire != first:
        fail(
            REREAD_IDENTICAL,
            f"{context}: the page read again differs from its first reading:\n"
            f"  first: {first!r}\n  again: {outcome.wire!r}",
        )


def check_token_replay(outcome: Outcome, *, context: str) -> None:
    """A token replayed with another project, after or through is a hard ``page_token_mismatch`` error."""
    if outcome.error_code != "page_token_mismatch":
        fail(
            TOKEN_BINDING,
            f"{context}: a token replayed out of its series must raise page_token_mismatch; "
            f"production {outcome.describe()}",
        )
