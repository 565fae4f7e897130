"""A small metrics registry written in the Prometheus text exposition format (version 0.0.4).

No client library: serve needs counters, gauges and one histogram, and the text format is a few lines
of code. Every metric is thread-safe (the projector thread, request threads and the scrape all touch
them). ``ServeMetrics`` names the series an operator of ``throughline serve`` expects; see docs/http.md.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from throughline.core.repair import REPAIR_OUTCOMES

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

#: Read latency buckets (seconds): a read is a few DuckDB queries, so most land in the millisecond
#: buckets; the upper ones catch reads that waited for the projector (the freshness wait, 2 s default).
READ_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Records in one projector transaction: one a commit when caught up at a trickle, up to a poll's
#: ``max_poll_records`` (10,000 by default) behind a backlog.
TRANSACTION_RECORD_BUCKETS: tuple[float, ...] = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000)

LabelKey = tuple[str, ...]


def _format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**63:
        return str(int(value))
    return repr(float(value))


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _labels_text(names: Sequence[str], values: Sequence[str], extra: tuple[str, str] | None = None) -> str:
    pairs = [f'{n}="{_escape_label(v)}"' for n, v in zip(names, values, strict=True)]
    if extra is not None:
        pairs.append(f'{extra[0]}="{_escape_label(extra[1])}"')
    return "{" + ",".join(pairs) + "}" if pairs else ""


class _Metric:
    kind = "untyped"

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> None:
        if not _NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        for label in labelnames:
            if not _LABEL.match(label) or label.startswith("__") or label == "le":
                raise ValueError(f"invalid label name {label!r}")
        self.name = name
        self.help = help_text
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()

    def _key(self, labels: Mapping[str, object]) -> LabelKey:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {tuple(labels)}")
        return tuple(str(labels[n]) for n in self.labelnames)

    def _header(self) -> list[str]:
        return [f"# HELP {self.name} {_escape_help(self.help)}", f"# TYPE {self.name} {self.kind}"]

    def render(self) -> list[str]:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError


class _SeriesMetric(_Metric):
    """A metric of one value a series (a counter or a gauge)."""

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labelnames)
        self._values: dict[LabelKey, float] = {}

    def render(self) -> list[str]:
        """The metric's lines."""
        with self._lock:
            items = sorted(self._values.items())
        return self._header() + [f"{self.name}{_labels_text(self.labelnames, k)} {_format_value(v)}" for k, v in items]


class Counter(_SeriesMetric):
    """A value that only goes up (its name ends in ``_total``)."""

    kind = "counter"

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> None:
        if not name.endswith("_total"):
            raise ValueError("a counter's name ends in _total")
        super().__init__(name, help_text, labelnames)
        if not self.labelnames:
            self._values[()] = 0.0

    def inc(self, amount: float = 1.0, **labels: object) -> None:
        """Add ``amount`` (>= 0) to the series named by ``labels``."""
        if amount < 0:
            raise ValueError("a counter never goes down")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: object) -> float:
        """The current value of one series (0 when never incremented)."""
        with self._lock:
            return self._values.get(self._key(labels), 0.0)


class Gauge(_SeriesMetric):
    """A value that goes up and down; ``replace`` swaps every series at once (per-partition values)."""

    kind = "gauge"

    def set(self, value: float, **labels: object) -> None:
        """Set one series."""
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def inc(self, amount: float = 1.0, **labels: object) -> None:
        """Add ``amount`` (may be negative) to one series."""
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def replace(self, series: Iterable[tuple[Mapping[str, object], float]]) -> None:
        """Replace every series with ``series`` (series not named disappear)."""
        values = {self._key(labels): float(v) for labels, v in series}
        with self._lock:
            self._values = values

    def value(self, **labels: object) -> float | None:
        """The current value of one series, or ``None`` when unset."""
        with self._lock:
            return self._values.get(self._key(labels))


@dataclass
class _HistogramSeries:
    buckets: list[int]
    total: float = 0.0
    count: int = 0


class Histogram(_Metric):
    """Observations counted into cumulative ``le`` buckets, with ``_sum`` and ``_count``."""

    kind = "histogram"

    def __init__(self, name: str, help_text: str, buckets: Sequence[float], labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labelnames)
        bounds = [float(b) for b in buckets if not math.isinf(b)]
        if not bounds or bounds != sorted(set(bounds)):
            raise ValueError("histogram buckets must be distinct and increasing")
        self.bounds = tuple(bounds)
        self._series: dict[LabelKey, _HistogramSeries] = {}
        if not self.labelnames:
            self._series[()] = _HistogramSeries([0] * len(self.bounds))

    def observe(self, value: float, **labels: object) -> None:
        """Count one observation."""
        key = self._key(labels)
        with self._lock:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = _HistogramSeries([0] * len(self.bounds))
            for i, bound in enumerate(self.bounds):
                if value <= bound:
                    series.buckets[i] += 1
                    break
            series.total += value
            series.count += 1

    def count(self, **labels: object) -> int:
        """How many observations one series has."""
        with self._lock:
            series = self._series.get(self._key(labels))
            return 0 if series is None else series.count

    def render(self) -> list[str]:
        """The metric's lines (buckets are cumulative, as the format requires)."""
        with self._lock:
            items = sorted((k, _HistogramSeries(list(s.buckets), s.total, s.count)) for k, s in self._series.items())
        lines = self._header()
        for key, series in items:
            running = 0
            for bound, n in zip(self.bounds, series.buckets, strict=True):
                running += n
                labels = _labels_text(self.labelnames, key, ("le", _format_value(bound)))
                lines.append(f"{self.name}_bucket{labels} {running}")
            lines.append(f"{self.name}_bucket{_labels_text(self.labelnames, key, ('le', '+Inf'))} {series.count}")
            lines.append(f"{self.name}_sum{_labels_text(self.labelnames, key)} {_format_value(series.total)}")
            lines.append(f"{self.name}_count{_labels_text(self.labelnames, key)} {series.count}")
        return lines


class Registry:
    """An ordered set of metrics, and hooks that refresh gauges just before a scrape."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}
        self._hooks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def _add(self, metric: _Metric) -> None:
        with self._lock:
            if metric.name in self._metrics:
                raise ValueError(f"metric {metric.name} is registered twice")
            self._metrics[metric.name] = metric

    def counter(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> Counter:
        """Register a counter."""
        metric = Counter(name, help_text, labelnames)
        self._add(metric)
        return metric

    def gauge(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> Gauge:
        """Register a gauge."""
        metric = Gauge(name, help_text, labelnames)
        self._add(metric)
        return metric

    def histogram(
        self, name: str, help_text: str, buckets: Sequence[float], labelnames: Sequence[str] = ()
    ) -> Histogram:
        """Register a histogram."""
        metric = Histogram(name, help_text, buckets, labelnames)
        self._add(metric)
        return metric

    def on_scrape(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` before every ``render`` (to refresh gauges read from elsewhere)."""
        with self._lock:
            self._hooks.append(hook)

    def render(self) -> str:
        """The whole registry in the text exposition format (hooks handle their own failures)."""
        with self._lock:
            hooks = list(self._hooks)
            metrics = list(self._metrics.values())
        for hook in hooks:
            hook()
        lines: list[str] = []
        for metric in metrics:
            lines.extend(metric.render())
        return "\n".join(lines) + "\n"


class ServeMetrics:
    """The series ``throughline serve`` exposes at ``GET /metrics``."""

    def __init__(self, registry: Registry | None = None) -> None:
        self.registry = registry or Registry()
        r = self.registry
        self.applied_offset = r.gauge(
            "throughline_projector_applied_offset",
            "Next log offset the projector will apply, per partition (everything below it is committed).",
            ["partition"],
        )
        self.end_offset = r.gauge(
            "throughline_log_end_offset", "End offset of the topic's partition at scrape time.", ["partition"]
        )
        self.lag = r.gauge(
            "throughline_projector_lag_records",
            "Records the projector has not applied yet, per partition (end offset minus applied offset).",
            ["partition"],
        )
        self.projector_up = r.gauge("throughline_projector_up", "1 while the projector thread runs, 0 once it stopped.")
        self.turns_applied = r.counter(
            "throughline_projector_turns_applied_total",
            "Turns the projector appended to a chain since the service started (duplicates excluded).",
        )
        self.records_applied = r.counter(
            "throughline_projector_records_total",
            "Log records the projector consumed and committed since the service started.",
        )
        # Together they say why turns wait: the rate of ``_sum`` is the share of the time the projector
        # spends in a transaction (a turn arriving meanwhile waits for it to end), ``_count`` the commits.
        self.transaction_duration = r.histogram(
            "throughline_projector_transaction_duration_seconds",
            "Wall time of one projector transaction that applied records, from the fetched batch in hand "
            "to its commit (the fold and every statement).",
            READ_BUCKETS,
        )
        self.transaction_records = r.histogram(
            "throughline_projector_transaction_records",
            "Log records applied in one projector transaction.",
            TRANSACTION_RECORD_BUCKETS,
        )
        self.quarantined = r.counter(
            "throughline_projector_quarantined_records_total",
            "Records the projector quarantined (undecodable or breaking their chain) since the service started.",
        )
        self.reads = r.counter(
            "throughline_reads_total",
            "Observer reads answered, by status (ok, projection_pending, resync_required, error).",
            ["status"],
        )
        self.read_errors = r.counter(
            "throughline_read_errors_total", "Observer reads refused or failed, by error code.", ["code"]
        )
        self.read_latency = r.histogram(
            "throughline_read_duration_seconds",
            "Time spent answering an Observer read, excluding the long-poll wait for new turns.",
            READ_BUCKETS,
        )
        self.long_polls = r.gauge("throughline_long_polls_waiting", "Read requests waiting for new turns right now.")
        self.long_polls.set(0)  # exported from the first scrape: a scraper (or a test) never sees it missing
        self.reads_forwarded = r.counter(
            "throughline_reads_forwarded_total",
            "serve --group: reads this member forwarded to a holder of their partition, by the holder's HTTP "
            "status (failed: no holder answered).",
            ["code"],
        )
        self.http_requests = r.counter(
            "throughline_http_requests_total", "HTTP requests answered, by route and status code.", ["route", "code"]
        )
        self.scrape_errors = r.counter(
            "throughline_scrape_errors_total",
            "Scrapes whose log end offsets could not be read (the broker did not answer).",
        )
        self.quarantine_records = r.gauge(
            "throughline_projection_quarantined_records",
            "Records in the projection's quarantine, by reason code and whether a repair marked them "
            "(state: unrepaired, repaired); read from the projection at scrape time.",
            ["code", "state"],
        )
        self.broken_sources = r.gauge(
            "throughline_projection_broken_sources",
            "Sources the reader refuses to serve (a rejected record no repair marked), by the reason code of "
            "the record that broke them; read from the projection at scrape time.",
            ["code"],
        )
        self.repairs = r.gauge(
            "throughline_projection_repairs",
            "Repair records the projector applied, by outcome (repaired, not_broken, unknown_source).",
            ["outcome"],
        )
        for status in ("ok", "projection_pending", "resync_required", "error"):
            self.reads.inc(0, status=status)
        for outcome in REPAIR_OUTCOMES:
            self.repairs.set(0, outcome=outcome)

    def set_offsets(self, applied: Mapping[int, int], end: Mapping[int, int] | None) -> None:
        """Refresh the per-partition gauges (``end=None`` when the broker did not answer)."""
        self.applied_offset.replace(({"partition": p}, v) for p, v in applied.items())
        if end is not None:
            self.end_offset.replace(({"partition": p}, v) for p, v in end.items())
            self.lag.replace(({"partition": p}, max(0, end[p] - applied.get(p, 0))) for p in end)

    def set_quarantine(self, listing: Any) -> None:
        """Refresh the quarantine gauges from a projection's ``quarantine(times=False)`` listing."""
        records: dict[tuple[str, str], int] = {}
        for q in listing.records:
            key = (q.code, "unrepaired" if q.repaired_by is None else "repaired")
            records[key] = records.get(key, 0) + 1
        self.quarantine_records.replace(({"code": c, "state": st}, n) for (c, st), n in records.items())
        broken: dict[str, int] = {}
        for b in listing.broken:
            broken[b.code or "unknown"] = broken.get(b.code or "unknown", 0) + 1
        self.broken_sources.replace(({"code": c}, n) for c, n in broken.items())
        outcomes = dict.fromkeys(REPAIR_OUTCOMES, 0)
        for r in listing.repairs:
            outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
        self.repairs.replace(({"outcome": o}, n) for o, n in outcomes.items())

    def render(self) -> str:
        """The text exposition of every series."""
        return self.registry.render()
