"""Item 8: the projector beside a Kafka Streams application doing its job (``bench.streams_peer``), in one
run: correctness first, then throughput, memory and freshness.

- Correctness: every fold of the item-1 topic by the peer is compared, source by source (length, head
  chain digest, broken mark), with the projector's; a peer that disagrees raises ``PeerDisagreesError``
  and nothing of it is timed or reported.
- Throughput: per repetition, back to back on the item-1 topic: the projector (in process, offset 0 to
  the end, as item 1 times it), the peer under ``exactly_once_v2`` and under ``at_least_once`` (a JVM
  subprocess with a fresh application id and state dir; its clock runs from ``KafkaStreams.start()`` to
  the group's committed offsets reaching the log's end, so JVM start-up is not counted but the group's
  first rebalance is). ``--ratio-repeat`` repetitions, the target ratio a median of per-repetition ratios
  with item 1's confidence interval.
- Memory: peak RSS (VmHWM, ``bench.memory.peak_rss``) of ``throughline project --until-caught-up`` and of
  the peer (each guarantee) folding the same topic, once each.
- Freshness: the sweep's rig (``bench.freshness_rig``; ``bench.streams_fresh`` for the peer) at 10,
  1,000 and 5,000 turns/s and at half of each contender's own capacity (its median rate above), with
  ``cfg.freshness_projects`` projects; ack -> readable through each one's own read path.
- Where it goes (``bench.streams_profile``): every cell traced (``serve``'s path step by step, the
  peer's fold), joined per followed turn; the 1,000/s and 5,000/s cells once more under py-spy
  (``serve``, its fetch worker) and the JDK Flight Recorder (the peer) unless ``--profile none``.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

from bench import streams_peer, streams_profile
from bench.common import Config, Encoded, Figure, Section, Target, against_noise, log, wants_profile
from bench.freshness import _fmt
from bench.freshness_rig import FIRST_PAGE_LIMIT, POLL_BOUND_S, Rig
from bench.memory import peak_rss, project_command
from bench.profile import recording
from bench.projector import _fresh, run_projector
from bench.streams_fresh import StreamsRig

EOS, ALOS = streams_peer.GUARANTEES
#: The fixed rates of the side-by-side freshness cells (the issue's); half of each one's capacity is added.
FRESH_RATES = (10.0, 1_000.0, 5_000.0)
QUICK_FRESH_RATES = (10.0, 1_000.0)
THROUGHPUT_TARGET = 1.0  # projector / Kafka Streams EOS records/s
FRESH_TARGET = 0.5  # projector p50 / Kafka Streams EOS p50 at every rate


def _throughput(cfg: Config, bootstrap: str, topic: str, data: Encoded, workdir: Path) -> dict[str, list[float]]:
    n = data.count
    rates: dict[str, list[float]] = {
        "projector": [],
        EOS: [],
        ALOS: [],
        EOS + "/first": [],
        ALOS + "/first": [],
    }
    reps = max(cfg.repeat, cfg.ratio_repeat)
    for rep in range(reps):
        db = workdir / "ks-projector.duckdb"
        s = run_projector(bootstrap, topic, _fresh(db), n)
        reference = streams_peer.projector_chains(db)
        _fresh(db)
        rates["projector"].append(n / s)
        line = f"rep {rep + 1}/{reps}: projector {n / s:,.0f}/s"
        for guarantee in (EOS, ALOS):
            run = streams_peer.run_fold(bootstrap, topic, guarantee, n, workdir)
            streams_peer.require_agreement(reference, run.chains, f"Kafka Streams ({guarantee})")
            rates[guarantee].append(run.rate)
            rates[guarantee + "/first"].append(run.rate_after_start)
            line += (
                f", Kafka Streams {guarantee} {run.rate:,.0f}/s ({run.rate_after_start:,.0f}/s after its first "
                f"record at {run.first_record_s:.1f} s; {len(run.chains)} chains agree)"
            )
        log(line)
    return rates


def _memory(bootstrap: str, topic: str, data: Encoded, workdir: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    db = _fresh(workdir / "ks-mem.duckdb")
    out["projector"], _ = peak_rss(project_command(bootstrap, topic, db))
    _fresh(db)
    for guarantee in (EOS, ALOS):
        state = workdir / "ks-mem-state"
        out[guarantee], _ = peak_rss(streams_peer.command(bootstrap, topic, state, guarantee, expect=data.count))
    log("peak RSS MiB: " + ", ".join(f"{k} {v:,.0f}" for k, v in out.items()))
    return out


def _cells(cfg: Config, rig: Rig, capacity: float, tag: str, also: float | None = None) -> list[dict[str, Any]]:
    """The cells of one contender: the fixed rates, half its own capacity, and (``also``) one more rate."""
    rates = QUICK_FRESH_RATES if cfg.quick else FRESH_RATES
    plan = [(r, p, f"{r:,.0f}/s", False) for r in rates for p in cfg.freshness_projects]
    if not cfg.quick:
        plan += [(max(1.0, capacity / 2), p, "half capacity", True) for p in cfg.freshness_projects]
        if also is not None:
            plan += [
                (also, p, f"{also:,.0f}/s (half Kafka Streams EOS capacity)", False) for p in cfg.freshness_projects
            ]
    out = []
    for i, (rate, projects, label, half) in enumerate(plan):
        r = rig.run_cell(i, rate, projects, label=label)
        r["half"] = half
        r["trace"] = streams_profile.trace_cell(rig, r)
        out.append(r)
        log(
            f"{tag} {label} ({rate:,.0f}/s) x {projects}: achieved {r['achieved']:,.0f}/s, ack -> readable p50 "
            f"{_fmt(r['fresh_p50'], '{:.1f}')} p99 {_fmt(r['fresh_p99'], '{:.1f}')} ms ({r['samples']} samples, "
            f"{r['missed']} missed), reads {r['statuses']}"
        )
        streams_profile.log_trace(tag, r)
    return out


def _freshness(
    cfg: Config, bootstrap: str, workdir: Path, capacity: dict[str, float]
) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """Every contender's cells (traced), and the profiles of the projector's and Kafka Streams EOS's
    1,000/s and 5,000/s cells (``bench.streams_profile``) unless ``--profile none``."""
    out: dict[str, list[dict[str, Any]]] = {}
    profiles: list[str] = []
    trace = workdir / "serve-trace"
    shutil.rmtree(trace, ignore_errors=True)
    rig: Rig = Rig(cfg, bootstrap, workdir, trace=trace)
    try:
        # Also at the rate of Kafka Streams EOS's half-capacity cells: the same load side by side.
        out["projector"] = _cells(cfg, rig, capacity["projector"], "projector", also=max(1.0, capacity[EOS] / 2))
        if streams_profile.wanted(cfg):
            profiles += streams_profile.profile_cells(cfg, rig, "`throughline serve`")
    finally:
        rig.close()
    for guarantee in (EOS, ALOS):
        rig = StreamsRig(cfg, bootstrap, workdir, guarantee, trace=trace)
        try:
            out[guarantee] = _cells(cfg, rig, capacity[guarantee], f"Kafka Streams {guarantee}")
            if guarantee == EOS and streams_profile.wanted(cfg):
                profiles += streams_profile.profile_cells(cfg, rig, f"Kafka Streams {EOS}")
        finally:
            rig.close()
    return out, profiles


def _fresh_table(cells: dict[str, list[dict[str, Any]]]) -> str:
    rows = [
        "| ingest | projects | contender | achieved /s | ack -> readable p50 / p99 ms (samples, missed) "
        "| reads answered | read p50 / p99 ms | projector p50 / this p50 |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def row(r: dict[str, Any], who: str, ratio: float | None) -> str:
        label = f"half capacity ({r['rate']:,.0f}/s)" if r["half"] else r["label"]
        return (
            f"| {label} | {r['projects']} | {who} "
            f"| {_fmt(r['achieved'])} | {_fmt(r['fresh_p50'], '{:,.1f}')} / {_fmt(r['fresh_p99'], '{:,.1f}')} "
            f"({r['samples']:,}, {r['missed']:,}) | {r['ok']:,} of {r['reads']:,} ({_fmt(r['ok_share'], '{:.1f}')}%) "
            f"| {_fmt(r['read_p50'], '{:,.1f}')} / {_fmt(r['read_p99'], '{:,.1f}')} "
            f"| {'' if ratio is None else _fmt(ratio, '{:.2f}')} |"
        )

    def ratio(p: dict[str, Any], r: dict[str, Any]) -> float:
        return p["fresh_p50"] / r["fresh_p50"] if r["fresh_p50"] > 0 else math.nan

    proj, eos, alos = cells.get("projector", []), cells.get(EOS, []), cells.get(ALOS, [])
    for i, p in enumerate(proj[: len(eos)]):
        rows.append(row(p, "projector (serve)", None))
        rows.append(row(eos[i], f"Kafka Streams {EOS}", ratio(p, eos[i])))
        if i < len(alos):
            rows.append(row(alos[i], f"Kafka Streams {ALOS}", ratio(p, alos[i])))
    halves = [r for r in eos if r["half"]]
    for p, k in zip(proj[len(eos) :], halves, strict=False):  # the projector at Kafka Streams EOS's half rate
        rows.append(row(p, "projector (serve), same rate as the next row", None))
        rows.append(row(k, f"Kafka Streams {EOS} (its cell above)", ratio(p, k)))
    return "\n".join(rows)


def measure(cfg: Config, bootstrap: str, topic: str, data: Encoded, workdir: Path) -> Section:
    """Item 8: correctness, throughput, memory and freshness of the projector beside Kafka Streams."""
    streams_peer.ensure_built()
    sec = Section("kafka-streams", "8. Beside Kafka Streams (the strongest peer)")
    rates = _throughput(cfg, bootstrap, topic, data, workdir)
    f_proj = Figure("projector, streaming (offset 0 to end, in process)", rates["projector"], "records/s")
    f_eos = Figure("Kafka Streams, exactly_once_v2 (start to last offset committed)", rates[EOS], "records/s")
    f_alos = Figure("Kafka Streams, at_least_once (start to last offset committed)", rates[ALOS], "records/s")
    r_eos = Figure(
        "projector / Kafka Streams EOS, per repetition",
        [a / b for a, b in zip(rates["projector"], rates[EOS], strict=True)],
        "ratio",
        "{:.2f}",
    )
    r_alos = Figure(
        "projector / Kafka Streams ALOS, per repetition",
        [a / b for a, b in zip(rates["projector"], rates[ALOS], strict=True)],
        "ratio",
        "{:.2f}",
    )
    f_eos1 = Figure(
        "Kafka Streams, exactly_once_v2, from its first record folded (not a target)",
        rates[EOS + "/first"],
        "records/s",
    )
    f_alos1 = Figure(
        "Kafka Streams, at_least_once, from its first record folded (not a target)",
        rates[ALOS + "/first"],
        "records/s",
    )
    sec.figures = [f_proj, f_eos, f_alos, f_eos1, f_alos1, r_eos, r_alos]
    sec.targets = [
        Target(
            f"projector >= {THROUGHPUT_TARGET:g}x Kafka Streams EOS throughput",
            r_eos.median,
            THROUGHPUT_TARGET,
            text=against_noise(r_eos.samples, THROUGHPUT_TARGET),
        ),
    ]
    try:
        mem = _memory(bootstrap, topic, data, workdir)
        sec.figures += [Figure(f"peak RSS folding the topic: {k}", [v], "MiB") for k, v in mem.items()]
    except Exception as exc:  # memory is the lowest priority: report, do not lose the rest
        sec.notes.append(f"Memory was not measured: {exc}")
    capacity = {"projector": f_proj.median, EOS: f_eos.median, ALOS: f_alos.median}
    cells, profiles = _freshness(cfg, bootstrap, workdir, capacity)
    sec.tables = [_fresh_table(cells), *streams_profile.trace_tables(cells, EOS)]
    sec.profiles += profiles
    ratios = [
        (p["fresh_p50"] / k["fresh_p50"], p)
        for p, k in zip(cells["projector"], cells[EOS], strict=False)
        if k["fresh_p50"] > 0 and not math.isnan(p["fresh_p50"] / k["fresh_p50"])
    ]
    worst = max(ratios, key=lambda x: x[0]) if len(ratios) == len(cells[EOS]) else None
    sec.targets.append(
        Target(
            f"ack -> readable p50 <= {FRESH_TARGET:g}x Kafka Streams EOS at every rate",
            worst[0] if worst else math.nan,
            FRESH_TARGET,
            higher_is_better=False,
            text=f"projector p50 / Kafka Streams EOS p50; worst cell: {worst[1]['label']}, {worst[1]['projects']} project(s)"
            if worst
            else "a cell had no samples",
        )
    )
    if wants_profile(cfg, sec.targets[:1]):
        with recording("projector, streaming (profile run, item 8)", workdir / "ks-projector.pyspy") as got:
            run_projector(bootstrap, topic, _fresh(workdir / "ks-projector.duckdb"), data.count)
        _fresh(workdir / "ks-projector.duckdb")
        sec.profiles.append(got[0].markdown())
        sec.targets[0].bottleneck = got[0].bottleneck()
    sec.notes = notes(cfg) + sec.notes
    return sec


def notes(cfg: Config) -> list[str]:
    """How item 8 measures (the report's notes)."""
    return [
        "The peer: `bench/peers/kafka-streams/` (kafka-streams 4.1.0 and Avro 1.12.0 from Maven Central, built by "
        "the bench with Maven into `~/.cache/throughline/bench-peers/kafka-streams-HASH`). One Processor API "
        "processor decodes each record (the single-object header's CRC-64-AVRO fingerprint picks the writer "
        "schema from `schemas/*.avsc`, resolved into the newest) and folds it by the projector's rules: project "
        "canonical form and hash, content digest, partition key, duplicate turn id (same content: skipped; other "
        "content: quarantined), seq order (gap: quarantined, rewind: the later turns superseded and kept), chain "
        "digest. State: five persistent (RocksDB) key-value stores with their changelogs (Kafka Streams' "
        "defaults), without a record cache. Kafka Streams 4.1.0 deadlocks an IQv2 query against a RocksDB "
        "`put` (they take the store's and the position's locks in opposite orders; KAFKA-19629, fixed after "
        "4.1; it hung this bench's first runs), so the app folds each record and answers each page under one "
        "lock of its own, and a cache, flushed at commit outside that lock, is left off. Its HTTP server (the JDK's "
        "`com.sun.net.httpserver`, loopback) runs with `sun.net.httpserver.nodelay=true`: with Nagle's algorithm on, "
        "its two writes a response met the client's delayed ACK and every read took ~44 ms (the first full run).",
        "Its configuration: Kafka Streams' documented defaults (one stream thread, `commit.interval.ms` 100 under "
        "`exactly_once_v2` and 30,000 under `at_least_once`) plus the "
        "throughput advice of its docs for its producer (the changelogs): `batch.size=131072`, `linger.ms=20`, "
        "`compression.type=lz4`; `auto.offset.reset=earliest`. No fetch tuning (it would cost freshness). At the "
        "last expected record the processor requests a commit (`ProcessorContext.commit()`), so the at-least-once "
        "clock does not wait out a 30 s interval.",
        "Correctness before any figure: each of the peer's folds is compared with the projector's chains of the "
        "same repetition (per source: length, head chain digest, broken mark; the projector's as its reader "
        "sees them); a disagreement stops the item (`PeerDisagreesError`) and no figure of the peer is reported.",
        f"Repetitions: {max(cfg.repeat, cfg.ratio_repeat)} (item 1's `--ratio-repeat` rule), each the projector "
        "and both peer configurations back to back; the throughput target is the median of the per-repetition "
        "ratios with its distribution-free interval. Memory: one run each (peak VmHWM; the JVM's default heap "
        "limit, a quarter of the machine's memory).",
        f"Freshness: the item-4 rig for each contender in turn (the projector as `throughline serve` with its "
        f"defaults; the peer serving its own HTTP endpoint), each over its own new topic, one sweep. The peer's "
        f"read is its first page (the latest {FIRST_PAGE_LIMIT} turns of the project's head source) from IQv2 "
        "queries with `PositionBound.at(topic, partition, acknowledged offset)`; 409 (`NOT_UP_TO_BOUND`) is a "
        "read not answered, and the poller retries as it does for the projector (every 2 ms). The projector's "
        "pollers read the page unbounded and check its through cursor, so its 'reads answered' counts every `ok` "
        f"page, covering or not. A turn not readable within {POLL_BOUND_S:g} s is missed (infinite in the "
        "percentiles). Half capacity is half of each contender's own median rate above (the target pairs those cells, as the issue "
        "asks); the projector also runs cells at Kafka Streams EOS's half-capacity rate, the same load side by side.",
        "Read isolation differs: IQv2 reads a task's stores as the stream thread wrote them, before the "
        "transaction that covers those writes commits (Kafka Streams 4.1 has no transactional state stores by "
        "default), so under exactly_once_v2 a bounded read can answer state a failure would roll back; the "
        "projector answers only what its DuckDB transaction committed. The peer's ack -> readable therefore "
        "does not include its 100 ms commit interval.",
        "Traces: every cell of this sweep runs traced. `serve` with `bench/serve_trace.py`'s hooks (loaded by "
        "a `sitecustomize` on its `PYTHONPATH`, in `serve` and its fetch worker): one line a poll, a frame, a "
        "stage and a read, stamped on the monotonic clock the acknowledgements use; the peer with `trace=1` "
        "(three array stores a record, under the lock its fold holds). Each followed turn is joined with them "
        "by partition and offset (the tables 'where ... goes'). Profiles (unless `--profile none`): the "
        "1,000/s and 5,000/s cells once more on the same rig, `serve` and its fetch worker under py-spy, "
        "Kafka Streams EOS under the JDK Flight Recorder (`jcmd JFR.start`, `profile` settings); those "
        "runs' own latencies carry the profiler's CPU and are not the table's.",
    ]
