"""Item 4: freshness at every rate, a sweep over steady ingest rates.

Each cell of the sweep is one steady rate (10, 100, 1,000, 5,000 turns/s and half the projector's
measured capacity by default) with one busy project or with 64 projects, 512-byte bodies, run on the rig
of ``bench.freshness_rig`` (one ``throughline serve`` with its defaults for the whole sweep). Cells run in
order of rate, each once the projector has caught up with the one before; the first ``warmup`` seconds
of each cell are not measured. This module plans the cells, turns their figures into one table and
checks the issue's targets. The machine has two cores: the broker, serve, the producers and the pollers
share them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.common import Config, Figure, Section, Target, Workload, log, percentile, wants_profile
from bench.freshness_rig import (
    ACK_SAMPLES_PER_S,
    DRAIN_BOUND_S,
    FIRST_PAGE_LIMIT,
    FOLLOW_WAIT_S,
    LAG_EVERY_S,
    PER_PRODUCER_RATE,
    POLL_BOUND_S,
    PRODUCER_NICE,
    STALE_S,
    Rig,
)

#: Kafka Streams under exactly-once (``processing.guarantee=exactly_once_v2``) commits every 100 ms by
#: default (``commit.interval.ms``; 30 s without exactly-once), and a ``read_committed`` reader sees its
#: output only after that commit: the scale the issue compares to.
KAFKA_STREAMS_COMMIT_MS = 100.0

#: The issue's targets: up to this rate ack -> readable p50 / p99 within the first pair of bounds; at
#: half the projector's capacity within the second; reads ok in every cell.
STEADY_MAX_RATE = 5_000.0
STEADY_P50_MS, STEADY_P99_MS = 50.0, 250.0
HALF_P50_MS, HALF_P99_MS = 200.0, 1_000.0
OK_SHARE_MIN = 99.9
#: A cell measures its rate only when the producers sent it: below this share of the rate asked (the
#: load generator starved of CPU on this machine) the cell misses whatever its latencies.
ACHIEVED_MIN_SHARE = 95.0
#: Item 4's idle target: a first page over HTTP on ``serve``, idle.
IDLE_HTTP_P50_MS, IDLE_HTTP_P99_MS = 6.0, 15.0


# ------------------------------------------------------------------------------------------ the sweep


def _fmt(value: float, fmt: str = "{:,.0f}") -> str:
    if value != value:
        return "n/a"
    if math.isinf(value):
        return f"> {POLL_BOUND_S * 1000:,.0f}"
    return fmt.format(value)


def _misses(r: dict[str, Any], half: bool) -> list[str]:
    p50, p99 = (HALF_P50_MS, HALF_P99_MS) if half else (STEADY_P50_MS, STEADY_P99_MS)
    if r["samples"] + r["missed"] == 0 or not r["reads"]:
        return ["nothing measured"]
    out = []
    if not r["fresh_p50"] <= p50:
        out.append(f"p50 > {p50:g} ms")
    if not r["fresh_p99"] <= p99:
        out.append(f"p99 > {p99:g} ms")
    if not r["ok_share"] >= OK_SHARE_MIN:
        out.append(f"ok < {OK_SHARE_MIN:g}%")
    if not r["achieved_share"] >= ACHIEVED_MIN_SHARE:
        out.append(f"sent < {ACHIEVED_MIN_SHARE:g}% of the rate asked")
    return out


def _table(cells: list[dict[str, Any]]) -> str:
    rows = [
        "| ingest asked | projects | achieved /s (producers) | ack -> readable p50 / p99 ms | p50 / Kafka Streams' 100 ms "
        "| samples (missed, skipped) | first-page read p50 / p99 ms | reads `ok` | long-poll ack -> delivered "
        "p50 / p99 ms (turns) | lag records p50 / max | lag ms p50 / max | projector transactions: a second, "
        "records and ms each, busy | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in cells:
        misses = _misses(r, r["half"])
        rows.append(
            f"| {r['label']} | {r['projects']} | {_fmt(r['achieved'])} ({r['producers']}) "
            f"| {_fmt(r['fresh_p50'], '{:,.1f}')} / {_fmt(r['fresh_p99'], '{:,.1f}')} "
            f"| {_fmt(r['fresh_p50'] / KAFKA_STREAMS_COMMIT_MS, '{:.2f}x')} "
            f"| {r['samples']:,} ({r['missed']:,}, {r['stale']:,}) "
            f"| {_fmt(r['read_p50'], '{:,.1f}')} / {_fmt(r['read_p99'], '{:,.1f}')} "
            f"| {r['ok']:,} of {r['reads']:,} ({_fmt(r['ok_share'], '{:.2f}')}%) "
            f"| {_fmt(r['follow_p50'], '{:,.1f}')} / {_fmt(r['follow_p99'], '{:,.1f}')} ({r['follow_samples']:,}) "
            f"| {_fmt(r['lag_records_p50'])} / {_fmt(r['lag_records_max'])} "
            f"| {_fmt(r['lag_ms_p50'])} / {_fmt(r['lag_ms_max'])} "
            f"| {_transactions(r)} "
            f"| {'PASS' if not misses else 'MISS: ' + ', '.join(misses)} |"
        )
    return "\n".join(rows)


def _transactions(r: dict[str, Any]) -> str:
    """The projector's transactions in a cell, as the table and the log print them."""
    return (
        f"{_fmt(r['txn_per_s'])}/s, {_fmt(r['txn_records'], '{:,.1f}')}, {_fmt(r['txn_ms'], '{:,.1f}')} ms, "
        f"{_fmt(r['busy_pct'])}%"
    )


def _worst(cells: list[dict[str, Any]], key: str, higher_is_better: bool = False) -> tuple[float | None, str]:
    """The worst value of ``key`` over ``cells`` and where; NaN (not measured) if any cell lacks it."""
    if not cells:
        return None, "no cell"
    values = [(r[key], r) for r in cells]
    if any(v != v for v, _ in values):
        return math.nan, "a cell had no samples"
    v, r = (min if higher_is_better else max)(values, key=lambda x: x[0])
    return v, f"worst cell: {r['label']}, {r['projects']} project{'s' if r['projects'] != 1 else ''}"


def targets(cells: list[dict[str, Any]]) -> list[Target]:
    """The issue's targets over the sweep's cells (each the worst cell's value)."""
    steady = [r for r in cells if not r["half"] and r["rate"] <= STEADY_MAX_RATE]
    half = [r for r in cells if r["half"]]
    out: list[Target] = []
    for name, group, key, threshold in (
        (
            f"ack -> readable p50 <= {STEADY_P50_MS:g} ms at every rate up to {STEADY_MAX_RATE:,.0f}/s",
            steady,
            "fresh_p50",
            STEADY_P50_MS,
        ),
        (
            f"ack -> readable p99 <= {STEADY_P99_MS:g} ms at every rate up to {STEADY_MAX_RATE:,.0f}/s",
            steady,
            "fresh_p99",
            STEADY_P99_MS,
        ),
        (f"ack -> readable p50 <= {HALF_P50_MS:g} ms at half the projector's capacity", half, "fresh_p50", HALF_P50_MS),
        (f"ack -> readable p99 <= {HALF_P99_MS:g} ms at half the projector's capacity", half, "fresh_p99", HALF_P99_MS),
    ):
        if group:
            value, where = _worst(group, key)
            out.append(Target(name, value, threshold, higher_is_better=False, text=f"ms; {where}"))
    if cells:
        value, where = _worst(cells, "ok_share", higher_is_better=True)
        out.append(
            Target(f"reads ok >= {OK_SHARE_MIN:g}% in every cell", value, OK_SHARE_MIN, text=f"% of reads; {where}")
        )
        value, where = _worst(cells, "achieved_share", higher_is_better=True)
        out.append(
            Target(
                f"the producers sent >= {ACHIEVED_MIN_SHARE:g}% of the rate asked in every cell (else the cell "
                "did not measure its rate)",
                value,
                ACHIEVED_MIN_SHARE,
                text=f"% of the rate asked; {where}",
            )
        )
    return out


def _idle_http(sec: Section, sweep: Rig, plan: list[tuple[float, int, str, bool]], reads: int) -> list[Target]:
    """First pages over HTTP once the sweep is over and serve is idle (every project the sweep wrote)."""
    projects = [
        Workload(1, projects=n, label=f"fresh{i}").project(k) for i, (_, n, _, _) in enumerate(plan) for k in range(n)
    ]
    ms, statuses = sweep.idle_reads(projects, reads)
    p50, p99 = percentile(ms, 50), percentile(ms, 99)
    log(f"freshness: idle first pages over HTTP p50 {p50:.2f} p99 {p99:.2f} ms {statuses}")
    sec.figures += [
        Figure("first page over HTTP, idle serve, p50", [p50], "ms", "{:.2f}"),
        Figure("first page over HTTP, idle serve, p99", [p99], "ms", "{:.2f}"),
    ]
    sec.notes.append(
        f"Idle reads: after the sweep, once the projector applied everything and nothing is produced, one "
        f"client times {len(ms)} first pages (limit {FIRST_PAGE_LIMIT}, after a warm-up) of the {len(projects)} "
        "projects the sweep wrote, in turn, over one keep-alive connection: "
        + ", ".join(f"{k} {v:,}" for k, v in sorted(statuses.items()))
        + " (item 4's idle HTTP target)."
    )
    where = f"ms; {len(ms)} reads"
    return [
        Target(
            f"first page over HTTP on an idle serve p50 <= {IDLE_HTTP_P50_MS:g} ms",
            p50,
            IDLE_HTTP_P50_MS,
            higher_is_better=False,
            text=where,
        ),
        Target(
            f"first page over HTTP on an idle serve p99 <= {IDLE_HTTP_P99_MS:g} ms",
            p99,
            IDLE_HTTP_P99_MS,
            higher_is_better=False,
            text=where,
        ),
    ]


def _plan(cfg: Config, capacity: float | None) -> list[tuple[float, int, str, bool]]:
    """The cells: ``(rate, projects, label, is_half_capacity)`` in the order they run."""
    plan: list[tuple[float, int, str, bool]] = []
    fixed = sorted(r for r in cfg.freshness_rates if r is not None)
    for rate in fixed:
        for projects in cfg.freshness_projects:
            plan.append((rate, projects, f"{rate:,.0f}/s", False))
    if None in cfg.freshness_rates:
        if capacity is None or not capacity > 0:
            raise RuntimeError("half capacity asked for but the projector's capacity was not measured")
        half = max(1.0, capacity / 2)
        for projects in cfg.freshness_projects:
            plan.append((half, projects, f"half capacity ({half:,.0f}/s)", True))
    return plan


def method_notes(cfg: Config) -> list[str]:
    """How the sweep measures (the report's notes, and docs/benchmarks.md's method text)."""
    return [
        f"`throughline serve` with its defaults (read wait 2 s) in its own process, one for the whole sweep, "
        f"over a new topic of {cfg.partitions} partitions. Producer processes send turns of "
        f"{cfg.freshness_body_bytes}-byte bodies, encoded before the cell as `TurnProducer` encodes them, with "
        "librdkafka (`confluent-kafka`, in its own pinned environment; the load costs this machine's two cores "
        "a third to a half of what kafka-python's producer costs) and `TurnProducer`'s delivery settings "
        "(acks=all, idempotent, its linger and batch size), paced open loop (turn i of a cell at start + i / "
        f"rate, whatever the acknowledgements do); one process per {PER_PRODUCER_RATE:,.0f} turns/s asked (at "
        f"most {cfg.freshness_producers}, at most one per source), each sending whole sources so that every "
        f"source's turns keep their order; a producer process's main thread runs at nice {PRODUCER_NICE} (the "
        "load takes the CPU `serve` leaves; librdkafka's threads keep the normal priority). 'achieved' is the turns "
        "sent over the seconds from the cell's start to the last send; below the rate asked, the producers "
        "could not keep up on this machine.",
        f"Each cell: {cfg.freshness_warmup:g} s of warm-up, then {cfg.freshness_seconds:g} s measured; it starts "
        "once the projector has applied everything before it. 'projects': 1 is one busy project (every turn "
        f"of the cell in one project, 4 sources), 64 spreads the turns round-robin over 64 projects.",
        f"ack -> readable: {cfg.freshness_pollers} poller threads (one keep-alive HTTP connection each) take "
        f"a sample of the acknowledgements (at most {ACK_SAMPLES_PER_S} a second) and re-read that project's first page (limit {FIRST_PAGE_LIMIT}) until its through "
        f"cursor covers the acknowledged offset. Every delay counts from the broker's append of the turn's "
        "batch (the topic stamps batches with `LogAppendTime`, whole milliseconds rounded down), which precedes "
        "the acknowledgement: a producer that reads its acknowledgement late cannot shorten the figure. An "
        f"acknowledgement no poller could take within {STALE_S * 1000:.0f} ms of its stamp is skipped (a later start would add its delay to the figure); one not readable within {POLL_BOUND_S:g} s "
        "is missed and counts as infinitely late in the percentiles. The first-page read figures and the "
        "`ok` share are over every read the pollers made.",
        "Long-poll: one more thread follows the cell's project 0 as an Observer does, one request at a time "
        f"(`afterCursor` = the last answer's through cursor, `wait={FOLLOW_WAIT_S:g}`); ack -> delivered is, for "
        "every acknowledged turn of that project, the delay to the first answer whose through cursor covers it "
        f"(a turn no answer covered within {POLL_BOUND_S:g} s of the cell's end counts as infinitely late).",
        f"Projector lag: `/readyz` every {LAG_EVERY_S * 1000:.0f} ms: records (log end minus applied offset, "
        "summed over partitions) and milliseconds since the acknowledgement of the oldest record not yet "
        "applied (the worst partition).",
        f"Targets: ack -> readable p50 <= {STEADY_P50_MS:g} ms and p99 <= {STEADY_P99_MS:g} ms at every rate "
        f"up to {STEADY_MAX_RATE:,.0f}/s (whatever the capacity), p50 <= {HALF_P50_MS:g} ms and p99 <= "
        f"{HALF_P99_MS / 1000:g} s at half the projector's capacity (item 1's median streaming rate when item 1 "
        "ran, else a quick measurement of its own), reads `ok` >= "
        f"{OK_SHARE_MIN:g}% in every cell. For scale: Kafka Streams under exactly-once commits every "
        f"{KAFKA_STREAMS_COMMIT_MS:.0f} ms by default (`commit.interval.ms`; 30 s without exactly-once), and "
        "a `read_committed` reader sees its output only after that commit; the table's fifth column is the "
        "p50 as a multiple of those 100 ms.",
    ]


def measure(cfg: Config, bootstrap: str, capacity: float | None, workdir: Path) -> Section:
    """The sweep: every cell of ``_plan`` against one serve; one table, the issue's targets."""
    plan = _plan(cfg, capacity)
    cells: list[dict[str, Any]] = []
    sweep = Rig(cfg, bootstrap, workdir)
    sec = Section("freshness", "4. Freshness at every rate")
    try:
        for i, (rate, projects, label, half) in enumerate(plan):
            r = sweep.run_cell(i, rate, projects, label=label)
            r["half"] = half
            cells.append(r)
            log(
                f"freshness {label} x {projects} project(s): achieved {r['achieved']:,.0f}/s "
                f"({r['producers']} producers), ack -> readable p50 "
                f"{_fmt(r['fresh_p50'], '{:.1f}')} p99 {_fmt(r['fresh_p99'], '{:.1f}')} ms ({r['samples']} samples, "
                f"{r['missed']} missed, {r['stale']} skipped), reads {r['reads']:,} {r['statuses']} p50 "
                f"{_fmt(r['read_p50'], '{:.1f}')} p99 {_fmt(r['read_p99'], '{:.1f}')} ms, lag {_fmt(r['lag_records_p50'])}"
                f"/{_fmt(r['lag_records_max'])} records {_fmt(r['lag_ms_p50'])}/{_fmt(r['lag_ms_max'])} ms, "
                f"long-poll answers {r['follow_statuses']}, transactions {_transactions(r)}"
            )
        sec.targets = targets(cells)
        sec.targets += _idle_http(sec, sweep, plan, cfg.freshness_idle_reads)
        missed = [r for r in cells if _misses(r, r["half"])]
        if wants_profile(cfg, sec.targets) and (missed or cfg.profile == "all"):
            worst = missed[0] if missed else cells[-1]
            r = sweep.run_cell(
                len(plan),
                worst["rate"],
                worst["projects"],
                label=worst["label"],
                profile_label=f"`throughline serve` at {worst['label']}, {worst['projects']} project(s) (profile run)",
            )
            prof = r["profile"]
            if prof is not None:
                sec.profiles.append(
                    prof.markdown() + f"\n\nThat run: ack -> readable p50 {_fmt(r['fresh_p50'], '{:.1f}')} ms, p99 "
                    f"{_fmt(r['fresh_p99'], '{:.1f}')} ms; reads ok {r['ok']:,} of {r['reads']:,}."
                )
                for t in sec.targets:
                    if t.passed is False:
                        t.bottleneck = prof.bottleneck()
    finally:
        sweep.close()
    sec.tables = [_table(cells)]
    statuses: dict[str, int] = {}
    for r in cells:
        for k, v in r["statuses"].items():
            statuses[k] = statuses.get(k, 0) + v
    sec.notes = (
        method_notes(cfg)
        + sec.notes
        + [
            "Read answers over all cells: " + ", ".join(f"{k} {v:,}" for k, v in sorted(statuses.items())) + "; "
            "an acknowledgement's pickup (from the ack to its poller's first read) p50 / max per cell: "
            + ", ".join(f"{_fmt(r['pickup_p50'], '{:.1f}')} / {_fmt(r['pickup_max'], '{:.1f}')} ms" for r in cells)
            + "; an acknowledgement's stamp after the broker appended its batch (LogAppendTime, ms resolution) "
            "p50 / p99 per cell: "
            + ", ".join(
                f"{_fmt(r['stamp_after_append_p50'], '{:.1f}')} / {_fmt(r['stamp_after_append_p99'], '{:.1f}')} ms"
                for r in cells
            )
            + ".",
        ]
    )
    sec.notes += [
        f"{r['label']} x {r['projects']}: the producer fell {r['behind_s']:.2f} s behind its schedule at worst"
        + (f"; {r['send_failed']} sends failed" if r["send_failed"] else "")
        + (
            f"; the projector had not caught up with the previous cell within {DRAIN_BOUND_S:.0f} s"
            if math.isinf(r["drained_s"])
            else ""
        )
        for r in cells
        if r["behind_s"] > 0.5 or r["send_failed"] or math.isinf(r["drained_s"])
    ]
    return sec
