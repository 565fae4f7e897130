"""A projector run reports each transaction it commits (``Tally.apply``: the batch and its wall time),
and ``serve`` counts them into its ``/metrics`` histograms (``metered_progress``). A real DuckDB file,
no broker."""

from __future__ import annotations

from pathlib import Path

from projector_histories import TOPIC, place, to_log, turn

from throughline.projector.runner import ProgressUpdate, Tally
from throughline.projector.store import BatchSummary, DuckProjection
from throughline.serve.metrics import ServeMetrics
from throughline.serve.projector_runs import metered_progress


def test_each_applied_batch_is_reported_with_its_records_and_its_time(tmp_path: Path) -> None:
    log = to_log(place([turn(turn_id=f"t{i}") for i in range(4)]))
    updates: list[ProgressUpdate] = []
    with DuckProjection.open(tmp_path / "p.duckdb", topic=TOPIC) as projection:
        tally = Tally(projection, updates.append, None, {0: 0}, 0.0)
        for part in (log[:1], log[1:4], log[1:4]):  # the last one is re-delivered: nothing to apply
            tally.apply(TOPIC, [projection.prepare(0, part)])
        assert projection.applied_offsets() == {0: 4}
    assert [u.batch.records for u in updates] == [1, 3, 0]
    assert [u.summary.records for u in updates] == [1, 4, 4]  # the run's totals, as before
    assert all(u.batch_seconds > 0 for u in updates[:2])
    assert tally.total == BatchSummary(records=4, appended=4)


def test_serve_counts_every_transaction_that_applied_records_into_its_histograms() -> None:
    metrics = ServeMetrics()
    progress = metered_progress(metrics)
    total = BatchSummary()
    batches = [
        (BatchSummary(records=1, appended=1), 0.004),
        (BatchSummary(records=30, appended=29, quarantined=1), 0.03),
        (BatchSummary(), 0.001),  # a re-delivered batch: no transaction
    ]
    for batch, seconds in batches:
        total = total + batch
        progress(ProgressUpdate(total, {0: total.records}, None, {0: 0}, 1.0, batch, seconds))
    text = metrics.render()
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(lines["throughline_projector_transaction_duration_seconds_count"]) == 2  # not the empty one
    assert abs(float(lines["throughline_projector_transaction_duration_seconds_sum"]) - 0.034) < 1e-9
    assert float(lines['throughline_projector_transaction_duration_seconds_bucket{le="0.005"}']) == 1
    assert float(lines["throughline_projector_transaction_records_sum"]) == 31
    assert float(lines['throughline_projector_transaction_records_bucket{le="25"}']) == 1
    assert float(lines['throughline_projector_transaction_records_bucket{le="50"}']) == 2
    # The counters still take the increments of the running totals.
    assert float(lines["throughline_projector_records_total"]) == 31
    assert float(lines["throughline_projector_turns_applied_total"]) == 30
    assert float(lines["throughline_projector_quarantined_records_total"]) == 1


def test_a_retried_run_goes_on_counting_though_its_totals_start_again() -> None:
    """serve retries a failed projector run with the same callback; the new run's totals restart at 0."""
    metrics = ServeMetrics()
    progress = metered_progress(metrics)
    first = BatchSummary(records=5, appended=5)
    progress(ProgressUpdate(first, {0: 5}, None, {0: 0}, 1.0, first, 0.01))
    again = BatchSummary(records=2, appended=2)  # the retried run's first batch: its totals are 2
    progress(ProgressUpdate(again, {0: 7}, None, {0: 5}, 0.5, again, 0.01))
    lines = dict(line.rsplit(" ", 1) for line in metrics.render().splitlines() if line and not line.startswith("#"))
    assert float(lines["throughline_projector_records_total"]) == 7
    assert float(lines["throughline_projector_turns_applied_total"]) == 7
    assert float(lines["throughline_projector_transaction_records_sum"]) == 7
