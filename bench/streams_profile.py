"""Item 8's freshness cells taken apart: where each followed turn's ack -> readable goes, and profiles.

- Traces (every cell of the streams sweep): ``serve`` runs traced (``bench.serve_trace``: instants of
  each poll, frame, stage and read along the projector's path), the peer with ``trace=1`` (the instant
  each record became readable in its stores, ``StreamsRig.folded``). Each followed turn of a cell is
  joined with them by ``(partition, offset)``: the table says how many milliseconds of its ack ->
  readable each step took (p50 / p90 over the cell's followed turns).
- Profiles (``--profile`` not ``none``): the 1,000/s and 5,000/s cells run once more on the same rig
  under a profiler, ``serve`` (every thread, and its fetch worker) under py-spy, the peer under the
  JDK Flight Recorder (``bench.jfr``). A profiler costs CPU on the two cores, so these cells' own
  figures are not the table's.
"""

from __future__ import annotations

import bisect
from typing import Any

from bench import serve_trace
from bench.common import Config, log, percentile
from bench.freshness import _fmt
from bench.freshness_rig import Rig
from bench.streams_fresh import StreamsRig

#: The rates whose cells are profiled.
PROFILE_RATES = (1_000.0, 5_000.0)


def trace_cell(rig: Rig, r: dict[str, Any]) -> dict[str, Any] | None:
    """The breakdown of cell ``r`` just run on ``rig`` (``None`` when the rig is not traced)."""
    if isinstance(rig, StreamsRig):
        return _peer_breakdown(rig.folded(), r["turns"])
    if rig.trace is None:
        return None
    return serve_trace.breakdown(rig.trace, r["turns"], r["window"])


def _peer_breakdown(folded: dict[int, tuple[list[int], list[float]]], turns: list[Any]) -> dict[str, Any]:
    to_store: list[float] = []
    to_client: list[float] = []
    for p, o, acked, readable in turns:
        offsets, times = folded.get(p, ([], []))
        i = bisect.bisect_left(offsets, o)
        if i == len(offsets) or offsets[i] != o:
            continue
        to_store.append((times[i] - acked) * 1000)
        to_client.append((readable - max(acked, times[i])) * 1000)
    return {
        "turns": len(turns),
        "joined": len(to_store),
        "steps": {
            "folded": (percentile(to_store, 50), percentile(to_store, 90)),
            "readable": (percentile(to_client, 50), percentile(to_client, 90)),
        },
    }


def _pair(x: tuple[float, float]) -> str:
    return f"{_fmt(x[0], '{:.1f}')} / {_fmt(x[1], '{:.1f}')}"


def _label(r: dict[str, Any]) -> str:
    return f"half capacity ({r['rate']:,.0f}/s)" if r.get("half") else r["label"]


def trace_tables(cells: dict[str, list[dict[str, Any]]], eos: str) -> list[str]:
    """Two markdown tables: the projector's steps, and the peer's (``eos``'s cells), per traced cell."""
    proj = [r for r in cells.get("projector", []) if r.get("trace")]
    legend = "; ".join(f"`{k}` {what}" for k, what in serve_trace.STEPS)
    rows = [
        "Where the projector's ack -> readable goes (p50 / p90 ms over each cell's followed turns, from "
        f"`serve`'s trace; each step from the end of the one before): {legend}; `read` -> the poller's read "
        "answers. The reads' own split (p50 of every read of the cell, in `serve`): all of it / the end "
        "offset (ListOffsets) / the wait for the projector / the page.",
        "",
        "| ingest | projects | ack -> readable p50 / p99 | "
        + " | ".join(k for k, _ in serve_trace.STEPS)
        + " | read | reads in serve: all / end offset / wait / page | read at the client p50 | turns joined |",
        "|---|---|---|" + "---|" * len(serve_trace.STEPS) + "---|---|---|---|",
    ]
    for r in proj:
        t = r["trace"]
        steps = " | ".join(_pair(t["steps"][k]) for k, _ in serve_trace.STEPS)
        read = " / ".join(_fmt(t["read"][k][0], "{:.1f}") for k in ("total", "end offset", "wait", "page"))
        rows.append(
            f"| {_label(r)} | {r['projects']} | {_fmt(r['fresh_p50'], '{:.1f}')} / {_fmt(r['fresh_p99'], '{:.1f}')} "
            f"| {steps} | {_pair(t['steps']['readable'])} | {read} (p50 of {t['reads']:,}) "
            f"| {_fmt(r['read_p50'], '{:.1f}')} | {t['joined']} of {t['turns']} |"
        )
    peer = [r for r in cells.get(eos, []) if r.get("trace")]
    out = ["\n".join(rows)]
    if peer:
        prow = [
            f"Where Kafka Streams {eos}'s ack -> readable goes (p50 / p90 ms, from its trace: the instant each "
            "record was folded into its stores, under the lock its reads take):",
            "",
            "| ingest | projects | ack -> readable p50 / p99 | broker append -> folded, readable in its stores "
            "| -> the poller's read answers | read at the client | turns joined |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in peer:
            t = r["trace"]
            prow.append(
                f"| {_label(r)} | {r['projects']} | {_fmt(r['fresh_p50'], '{:.1f}')} / "
                f"{_fmt(r['fresh_p99'], '{:.1f}')} | {_pair(t['steps']['folded'])} | {_pair(t['steps']['readable'])} "
                f"| {_fmt(r['read_p50'], '{:.1f}')} | {t['joined']} of {t['turns']} |"
            )
        out.append("\n".join(prow))
    return out


def log_trace(tag: str, r: dict[str, Any]) -> None:
    """One log line of a cell's breakdown."""
    t = r.get("trace")
    if not t:
        return
    steps = ", ".join(f"{k} {_pair(v)}" for k, v in t["steps"].items())
    reads = t.get("read")
    extra = (
        "" if not reads else "; reads in serve " + ", ".join(f"{k} {_fmt(v[0], '{:.1f}')}" for k, v in reads.items())
    )
    log(f"{tag} {r['label']} x {r['projects']} trace (p50 / p90 ms): {steps}{extra} ({t['joined']} of {t['turns']})")


def profile_cells(cfg: Config, rig: Rig, tag: str) -> list[str]:
    """The 1,000/s and 5,000/s cells once more under the rig's profiler; their profiles as markdown."""
    out: list[str] = []
    rates = PROFILE_RATES[:1] if cfg.quick else PROFILE_RATES
    for i, (rate, projects) in enumerate((r, p) for r in rates for p in cfg.freshness_projects):
        label = f"{tag} at {rate:,.0f}/s, {projects} project(s) (profile run)"
        r = rig.run_cell(1_000 + i, rate, projects, label=f"{rate:,.0f}/s", profile_label=label)
        prof = r.get("profile")
        log(
            f"{label}: ack -> readable p50 {_fmt(r['fresh_p50'], '{:.1f}')} p99 {_fmt(r['fresh_p99'], '{:.1f}')} ms; "
            + (prof.bottleneck() if prof is not None else "no profile")
        )
        if prof is not None:
            out.append(
                prof.markdown() + f"\n\nThat run: ack -> readable p50 {_fmt(r['fresh_p50'], '{:.1f}')} ms, p99 "
                f"{_fmt(r['fresh_p99'], '{:.1f}')} ms; read p50 {_fmt(r['read_p50'], '{:.1f}')} ms."
            )
    return out


def wanted(cfg: Config) -> bool:
    """Whether the profile cells run (every run but ``--profile none``, the default of ``--quick``)."""
    return cfg.profile != "none"
