"""``throughline ingest --dry-run``: the turns an ingest would append, printed instead of sent.

``PrintSender`` stands where the producer stands in the ingest loop (``Ingest``), so a dry run reads
the same files in the same order, parses, settles and resumes from a state exactly as the real run
would, and no broker is contacted. Each turn is one line of the ``jsonl`` ingest format
(``turn_line``), attributes included, so the output fed to ``throughline ingest -`` appends the same
records. A turn the producer would refuse (a record over the topic's limit) stops the dry run with
the producer's error.
"""

from __future__ import annotations

import json
from typing import IO, Any

from throughline.core.turn import TOPIC_MAX_MESSAGE_BYTES, TurnRecord, format_rfc3339
from throughline.producers.exceptions import InvalidTurnError, RecordTooLargeError
from throughline.producers.producer import RECORD_OVERHEAD_BYTES
from throughline.schemas.codec import encode_turn


def turn_line(turn: TurnRecord) -> dict[str, Any]:
    """A turn as one object of the ``jsonl`` ingest format (``parse_turn_line`` reads it back)."""
    return {
        "project": turn.project,
        "host": turn.host,
        "thread": turn.thread,
        "turnId": turn.turn_id,
        "seq": turn.seq,
        "completedAt": format_rfc3339(turn.completed_at_micros),
        "body": turn.body,
        "attributes": dict(sorted(turn.producer.attributes.items())),
    }


class _Printed:
    """A send that is done at once (nothing to acknowledge)."""

    done = True

    def result(self, timeout: float | None = None) -> None:
        """Nothing to wait for."""


class PrintSender:
    """A ``Sender`` that writes each turn as one JSON line on ``out`` (UTF-8) instead of sending it."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.printed = 0

    def send_async(self, turn: TurnRecord, *, validated: bool = False) -> _Printed:
        """Check the turn encodes into a record that fits, as the producer does, then print it."""
        try:
            size = len(encode_turn(turn))
        except Exception as exc:  # fastavro raises TypeError/ValueError/OverflowError for a bad field
            raise InvalidTurnError(f"the turn does not encode as a record: {type(exc).__name__}: {exc}") from None
        limit = TOPIC_MAX_MESSAGE_BYTES - RECORD_OVERHEAD_BYTES
        if size > limit:
            raise RecordTooLargeError(f"the encoded turn is {size} bytes; the limit is {limit} bytes")
        text = json.dumps(turn_line(turn), ensure_ascii=False, separators=(",", ":"))
        self.out.write(text.encode("utf-8") + b"\n")
        self.printed += 1
        return _Printed()

    def flush(self, timeout: float | None = None) -> None:
        """Flush the output."""
        self.out.flush()
