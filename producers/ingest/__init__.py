"""Streaming ingestion of completed turns (``throughline ingest``).

Its modules, one concern each:

- ``jsonl``: one line of the JSON Lines ingest format as a turn (``parse_turn_line``);
- ``state``: the ingest state file, where a run resumes (``IngestState``, ``load_ingest_state``, ``save_ingest_state``);
- ``tail``: complete lines of a file, followed like ``tail -F`` (``LineReader``);
- ``run``: the ingest loop (``Ingest``): send, collect acknowledgements, save the state, report;
- ``sessions``: hosts' session files (``ingest --format NAME``): many files, one loop;
- ``dry``: ``--dry-run``, the turns an ingest would append, printed instead of sent.
"""

from __future__ import annotations

from throughline.producers.ingest.jsonl import MAX_LINE_BYTES, TurnLine, parse_turn_line
from throughline.producers.ingest.run import Ingest, IngestStats, Sender, stop_on_signals
from throughline.producers.ingest.state import (
    INGEST_STATE_SCHEMA,
    INGEST_STATE_SUFFIX,
    FileId,
    IngestState,
    default_ingest_state_path,
    load_ingest_state,
    save_ingest_state,
)
from throughline.producers.ingest.tail import POLL_INTERVAL, Line, LineReader

__all__ = [
    "MAX_LINE_BYTES",
    "POLL_INTERVAL",
    "INGEST_STATE_SCHEMA",
    "INGEST_STATE_SUFFIX",
    "FileId",
    "Ingest",
    "IngestState",
    "IngestStats",
    "Line",
    "LineReader",
    "Sender",
    "stop_on_signals",
    "TurnLine",
    "default_ingest_state_path",
    "load_ingest_state",
    "parse_turn_line",
    "save_ingest_state",
]
