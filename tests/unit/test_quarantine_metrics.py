"""``/metrics`` counts the projection's quarantine: records by code and state, broken sources, repairs."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from test_serve_app import parse_metrics

from throughline.core.memory import FixedLog
from throughline.core.turn import build_turn
from throughline.projector.store import (
    BrokenSource,
    DuckProjection,
    LogRecord,
    QuarantineEntry,
    QuarantineListing,
    RepairEntry,
)
from throughline.schemas.codec import encode_turn
from throughline.serve.app import create_app
from throughline.serve.metrics import ServeMetrics

TOPIC = "throughline.turns"


def test_a_scrape_reads_the_quarantine_of_the_duckdb_projection(tmp_path: Path) -> None:
    turns = [
        build_turn(project="/p", host="h", thread="t", turn_id=f"u{i}", completed_at_micros=1, body="b", seq=seq)
        for i, seq in enumerate([1, 2, 5, 7])
    ]
    log = [LogRecord(0, i, t.project_sha256, encode_turn(t)) for i, t in enumerate(turns)]
    log.append(LogRecord(0, 4, None, b"junk"))
    with DuckProjection.open(tmp_path / "m.duckdb", topic=TOPIC) as projection:
        projection.apply_batch(TOPIC, 0, log)
        app = create_app(projection=projection, log=FixedLog(ends={0: 5}), token_key=bytes(32))
        with TestClient(app) as client:
            samples = parse_metrics(client.get("/metrics").text)
    records = "throughline_projection_quarantined_records"
    assert samples[(records, frozenset({("code", "chain_rejected"), ("state", "unrepaired")}))] == 2
    assert samples[(records, frozenset({("code", "record_undecodable"), ("state", "unrepaired")}))] == 1
    assert samples[("throughline_projection_broken_sources", frozenset({("code", "chain_rejected")}))] == 1
    for outcome in ("repaired", "not_broken", "unknown_source"):
        assert samples[("throughline_projection_repairs", frozenset({("outcome", outcome)}))] == 0


def test_the_gauges_follow_the_listing() -> None:
    metrics = ServeMetrics()
    entry = QuarantineEntry(0, 3, "chain_rejected", "gap", bytes(32), bytes(32), 10)
    listing = QuarantineListing(
        records=(entry, QuarantineEntry(0, 4, "chain_rejected", "gap", bytes(32), bytes(32), 10, repaired_by=(0, 9))),
        broken=(BrokenSource(bytes(32), bytes(32), 3, "gap", 0, 3, "chain_rejected"),),
        repairs=(RepairEntry(0, 9, bytes(32), bytes(32), "why", "repaired", 1, 3, 0),),
    )
    metrics.set_quarantine(listing)
    samples = parse_metrics(metrics.render())
    records = "throughline_projection_quarantined_records"
    assert samples[(records, frozenset({("code", "chain_rejected"), ("state", "unrepaired")}))] == 1
    assert samples[(records, frozenset({("code", "chain_rejected"), ("state", "repaired")}))] == 1
    assert samples[("throughline_projection_repairs", frozenset({("outcome", "repaired")}))] == 1
    # A later scrape with nothing quarantined drops the series (gauges are replaced, not accumulated).
    metrics.set_quarantine(QuarantineListing((), ()))
    samples = parse_metrics(metrics.render())
    assert not any(name == records for name, _ in samples)
    assert samples[("throughline_projection_repairs", frozenset({("outcome", "repaired")}))] == 0
