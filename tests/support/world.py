"""The tests' one turn builder (``make_turn``) and the pieces of an in-memory world (a ``FixedLog`` and
the turns on it) that the pure tiers share."""

from __future__ import annotations

from throughline.core.memory import FixedLog
from throughline.core.turn import TurnRecord, build_turn

BASE_MICROS = 1_780_000_000_000_000


def make_turn(
    project: str, host: str, thread: str, turn_id: str, *, at: int, body: str, seq: int | None = None
) -> TurnRecord:
    """A valid turn of source (``project``, ``host``, ``thread``) completed at ``at`` (µs since the epoch)."""
    return build_turn(
        project=project, host=host, thread=thread, turn_id=turn_id, completed_at_micros=at, body=body, seq=seq
    )


def numbered_turn(
    n: int, project: str, host: str, thread: str, *, body: str, id_prefix: str = "turn-id-", seq: int | None = None
) -> TurnRecord:
    """The ``n``-th turn of a world: turn id ``{id_prefix}{n}``, completed ``n`` ms after ``BASE_MICROS``."""
    return make_turn(project, host, thread, f"{id_prefix}{n}", at=BASE_MICROS + n * 1_000, body=body, seq=seq)


def append_to_log(log: FixedLog, record: TurnRecord) -> tuple[int, int]:
    """Place ``record`` at the end of its project's partition of ``log``; its (partition, offset)."""
    partition = log.partition_of(record.project_sha256)
    offset = log.ends.get(partition, 0)
    log.ends[partition] = offset + 1
    return partition, offset
