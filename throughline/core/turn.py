"""A completed turn as it travels on the log: the internal value type and its validation.

``TurnRecord`` is what one topic record holds after decoding. ``build_turn`` is the single place that
validates a turn and computes its content digest; producers call it before encoding and the projector
calls ``verify_turn`` after decoding, so a record that was tampered with or written by a buggy producer
is caught before it can enter a chain.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from throughline.core.chain import content_digest_utf8, micros_since_epoch
from throughline.core.exceptions import BodyTooLargeError, InvalidTurnError
from throughline.core.identity import canonical_project, project_sha256, source_sha256, validate_name
from throughline.errors import InputError

#: Largest body (UTF-8 bytes) a turn may carry. The topic's ``max.message.bytes`` is set to
#: ``TOPIC_MAX_MESSAGE_BYTES`` so that any valid turn, with its other fields, fits in one record.
MAX_BODY_BYTES = 512 * 1024
TOPIC_MAX_MESSAGE_BYTES = 1024 * 1024
#: Largest ``seq`` accepted: JavaScript's safe integer bound, so cursors and wire documents stay exact.
MAX_SEQ = 2**53 - 1
#: ``completedAt`` range: what RFC 3339 can write (years 0001..9999), in microseconds since the epoch.
MIN_COMPLETED_AT_MICROS = -62_135_596_800_000_000
MAX_COMPLETED_AT_MICROS = 253_402_300_799_999_999

# ASCII digits only, and \Z rather than $ (which would accept a trailing newline).
_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})\Z", re.ASCII
)


def parse_rfc3339(text: object) -> int:
    """Parse an RFC 3339 timestamp with an offset into microseconds since the epoch (UTC).

    Fractions beyond microseconds are truncated, not rounded, so a parse never moves a time forward.
    """
    if not isinstance(text, str):
        raise InvalidTurnError("completedAt must be an RFC 3339 string")
    m = _RFC3339.match(text)
    if not m:
        raise InvalidTurnError("completedAt must be RFC 3339 with a time zone, e.g. 2026-01-02T03:04:05Z")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    frac = (m.group(7) or ".")[1:]
    micros = int((frac + "000000")[:6]) if frac else 0
    zone = m.group(8)
    try:
        if second == 60:  # a leap second is folded into the last representable microsecond
            second, micros = 59, 999_999
        moment = datetime(year, month, day, hour, minute, second, micros, tzinfo=UTC)
    except ValueError as exc:
        raise InvalidTurnError(f"completedAt is not a real date/time: {exc}") from None
    if zone not in ("Z", "z"):
        sign = 1 if zone[0] == "+" else -1
        zh, zm = int(zone[1:3]), int(zone[4:6])
        if zh > 23 or zm > 59:
            raise InvalidTurnError("completedAt has an impossible UTC offset")
        try:
            moment -= sign * timedelta(hours=zh, minutes=zm)
        except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00 is before year 1 in UTC
            raise InvalidTurnError("completedAt lies outside the years 0001..9999 in UTC") from None
    return micros_since_epoch(moment)


def format_rfc3339(micros: int) -> str:
    """Format microseconds since the epoch as ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (always UTC)."""
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)
    # %Y does not zero-pad years below 1000 on every libc; RFC 3339 needs four digits.
    return f"{moment.year:04d}-{moment:%m-%dT%H:%M:%S.%f}Z"


@dataclass(frozen=True, slots=True)
class ProducerStamp:
    """Who wrote a log record and when: the ``producer`` sub-record every record family carries.

    Not content: no digest covers it (``contentDigest`` is the turn id, time and body only).
    """

    name: str = "throughline"
    version: str = "0"
    produced_at_micros: int = 0
    attributes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """One completed turn, as carried by one topic record."""

    project: str
    project_sha256: bytes
    host: str
    thread: str
    turn_id: str
    seq: int | None
    completed_at_micros: int
    body: str
    content_digest: bytes
    producer: ProducerStamp = field(default_factory=ProducerStamp)

    @property
    def source_sha256(self) -> bytes:
        """Hash-only identity of this turn's (host, thread) within its project."""
        return source_sha256(self.project_sha256, self.host, self.thread)

    @property
    def body_bytes(self) -> int:
        """Length of the body in UTF-8 bytes."""
        return len(self.body.encode("utf-8"))


def build_turn(
    *,
    project: str,
    host: str,
    thread: str,
    turn_id: str,
    completed_at_micros: int,
    body: str,
    seq: int | None = None,
    producer_name: str = "throughline",
    producer_version: str = "0",
    produced_at_micros: int = 0,
    attributes: Mapping[str, str] | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> TurnRecord:
    """Validate a turn's fields and return it with its canonical project and content digest."""
    canonical, project_hash, text = _checked_fields(
        project, host, thread, turn_id, completed_at_micros, body, seq, max_body_bytes
    )
    return TurnRecord(
        project=canonical,
        project_sha256=project_hash,
        host=host,
        thread=thread,
        turn_id=turn_id,
        seq=seq,
        completed_at_micros=completed_at_micros,
        body=body,
        content_digest=content_digest_utf8(turn_id, completed_at_micros, text),
        producer=ProducerStamp(producer_name, producer_version, produced_at_micros, dict(attributes or {})),
    )


def _checked_fields(
    project: str,
    host: str,
    thread: str,
    turn_id: str,
    completed_at_micros: int,
    body: str,
    seq: int | None,
    max_body_bytes: int,
) -> tuple[str, bytes, bytes]:
    """The one place a turn's fields are checked: ``(canonical project, its hash, body as UTF-8)``."""
    canonical = canonical_project(project)
    validate_name(host, "host")
    validate_name(thread, "thread")
    validate_name(turn_id, "turnId")
    if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= MAX_SEQ):
        raise InvalidTurnError(f"seq must be an integer in 1..{MAX_SEQ}")
    if isinstance(completed_at_micros, bool) or not isinstance(completed_at_micros, int):
        raise InvalidTurnError("completedAt must be a time")
    if not MIN_COMPLETED_AT_MICROS <= completed_at_micros <= MAX_COMPLETED_AT_MICROS:
        raise InvalidTurnError("completedAt must lie in the years 0001..9999")
    if not isinstance(body, str):
        raise InvalidTurnError("body must be a string")
    try:
        text = body.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidTurnError("body is not valid Unicode text") from None
    if len(text) > max_body_bytes:
        raise BodyTooLargeError(f"body is {len(text)} bytes; the limit is {max_body_bytes} bytes")
    return canonical, project_sha256(canonical), text


def verify_turn(record: TurnRecord) -> str | None:
    """Return why a decoded record must not enter a chain, or ``None`` when it is sound.

    Runs the same checks as ``build_turn`` without building a second record (the projector calls it
    for every record it reads).
    """
    return verify_turn_fields(
        record.project,
        record.project_sha256,
        record.host,
        record.thread,
        record.turn_id,
        record.seq,
        record.completed_at_micros,
        record.body,
        record.content_digest,
    )


#: ``content_problem``'s answer.
CONTENT_MISMATCH = "contentDigest does not match the turn's content"


def verify_turn_fields(
    project: str,
    project_hash: bytes,
    host: str,
    thread: str,
    turn_id: str,
    seq: int | None,
    completed_at_micros: int,
    body: str,
    content_digest: bytes,
    *,
    check_content: bool = True,
) -> str | None:
    """``verify_turn`` on a turn's fields, for a caller that never builds the ``TurnRecord``.

    ``check_content=False`` leaves out the last check, ``content_problem`` (the projector's fetch worker
    leaves it to the main process for the records it finds sound otherwise).
    """
    try:
        canonical, expected_hash, text = _checked_fields(
            project, host, thread, turn_id, completed_at_micros, body, seq, MAX_BODY_BYTES
        )
    except InputError as exc:  # InvalidTurnError, and InvalidProjectError for a bad project name
        return f"{exc.code}: {exc.message}"
    if canonical != project:
        return "project is not in canonical form"
    if expected_hash != project_hash:
        return "projectSha256 does not match the project"
    return content_problem(turn_id, completed_at_micros, text, content_digest) if check_content else None


def content_problem(turn_id: str, completed_at_micros: int, text: bytes, content_digest: bytes) -> str | None:
    """Why ``content_digest`` is not the digest of the turn's content (``text``: the body as UTF-8), or
    ``None``: the last of ``verify_turn_fields``' checks."""
    if content_digest_utf8(turn_id, completed_at_micros, text) != content_digest:
        return CONTENT_MISMATCH
    return None
