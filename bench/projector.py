"""Items 1 and 2: the projector and replay against the bare-consumer ceiling, and against what a user
would otherwise write (a per-record insert+commit loop, a Quix Streams app with a DuckDB batching sink).

Per repetition, in this order on the same topic: the ceiling's consumer three ways (kafka-python's
default fetch settings, the projector's, the projector's with throughline's record reader), projector (streaming, offset 0 to the end, in
process: ``Projector(...).run(until_caught_up=True)`` into a new file), replay (``replay()``, what
``throughline replay --db NEW`` runs, in process), Quix Streams, and the naive loop. Interleaving keeps the ratios honest on a machine whose load drifts.

Item 1's target ratios sit near their threshold (0.8) and the shared machine's speed drifts run to run,
so they get more repetitions (``--ratio-repeat``, default 7) than the other figures (``--repeat``): the
extra repetitions time only the ceiling (both settings), the projector and replay. Each target is the
median of the per-repetition ratios, reported with a distribution-free confidence interval of that
median, which says whether the run tells a pass or a miss apart from noise.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from bench import alternatives
from bench.ceiling import CONSUMER_SETTINGS, consume_and_decode
from bench.common import Config, Encoded, Figure, Section, Target, against_noise, log, wants_profile
from bench.profile import recording
from throughline.projector.runner import Projector, ProjectorOptions
from throughline.projector.store import DuckProjection

#: The projector's fetch settings. The ceiling is measured with these and with kafka-python's defaults
#: and is the faster of the two: the stock consumer reads large fetches slower (measured 33-34k/s with
#: these against 40-48k/s with 1 MB partition fetches), and a ceiling held down by the projector's
#: settings would flatter the projector.
_O = ProjectorOptions()
CEILING_SETTINGS: dict[str, Any] = {
    "fetch_max_bytes": _O.fetch_max_bytes,
    "max_partition_fetch_bytes": _O.max_partition_fetch_bytes,
    "max_poll_records": _O.max_poll_records,
    "fetch_max_wait_ms": _O.fetch_max_wait_ms,
}


def _fresh(path: Path) -> Path:
    for p in (path, Path(str(path) + ".wal")):
        p.unlink(missing_ok=True)
    return path


def run_projector(bootstrap: str, topic: str, db: Path, expected: int) -> float:
    """Seconds for an in-process projector to apply ``topic`` from offset 0 to its end into a new file."""
    with DuckProjection.open(_fresh(db), topic=topic) as proj:
        start = time.perf_counter()
        summary = Projector(proj, bootstrap, topic).run(until_caught_up=True)
        seconds = time.perf_counter() - start
    if summary.summary.records != expected or not summary.caught_up:
        raise RuntimeError(f"projector applied {summary.summary.records} of {expected} records")
    return seconds


def run_replay(bootstrap: str, topic: str, db: Path, expected: int) -> float:
    """Seconds for ``throughline.projector.replay.replay`` (what ``throughline replay --db NEW`` runs) to
    rebuild the projection into a new file: open, project from offset 0 to the end, checkpoint, rename."""
    from throughline.projector.replay import replay

    _fresh(db)
    start = time.perf_counter()
    summary = replay(bootstrap, topic, db)
    seconds = time.perf_counter() - start
    if summary.summary.records != expected or not summary.caught_up:
        raise RuntimeError(f"replay applied {summary.summary.records} of {expected} records")
    return seconds


def measure(cfg: Config, bootstrap: str, topic: str, data: Encoded, workdir: Path) -> tuple[Section, Section, float]:
    """Sections for items 1 and 2, and the projector's median capacity (records/s) for item 4."""
    n = data.count
    ceiling: list[float] = []
    default_ceiling: list[float] = []
    reader_ceiling: list[float] = []
    streaming: list[float] = []
    replay: list[float] = []
    quix: list[float] = []
    naive: list[float] = []
    naive_n = 0
    reps = max(cfg.repeat, cfg.ratio_repeat)
    for rep in range(reps):
        # Every repetition times the ceiling (both settings), the projector and replay back to back, so
        # that the ratios pair measurements taken under the same load; the figures that are no target
        # ratio of item 1 (the record reader's ceiling, Quix, the naive loop) run in the first ``repeat``.
        full = rep < cfg.repeat
        c0 = consume_and_decode(bootstrap, topic, settings=CONSUMER_SETTINGS)
        c = consume_and_decode(bootstrap, topic, settings=CEILING_SETTINGS)
        if c.records != n or c0.records != n:
            raise RuntimeError(f"ceiling read {c0.records} and {c.records} of {n}")
        default_ceiling.append(c0.rate)
        ceiling.append(c.rate)
        line = (
            f"rep {rep + 1}/{reps}: ceiling {c0.rate:,.0f}/s with kafka-python's defaults, {c.rate:,.0f}/s with the "
            "projector's settings"
        )
        if full:
            c2 = consume_and_decode(bootstrap, topic, settings=CEILING_SETTINGS, record_reader=True)
            if c2.records != n:
                raise RuntimeError(f"ceiling with the record reader read {c2.records} of {n}")
            reader_ceiling.append(c2.rate)
            line += f" ({c2.rate:,.0f}/s with our reader)"
        s = run_projector(bootstrap, topic, workdir / "streaming.duckdb", n)
        streaming.append(n / s)
        line += f", projector {n / s:,.0f}/s"
        r = run_replay(bootstrap, topic, workdir / "replay.duckdb", n)
        _fresh(workdir / "replay.duckdb")
        replay.append(n / r)
        line += f", replay {n / r:,.0f}/s"
        if full:
            state = workdir / "quix-state"
            shutil.rmtree(state, ignore_errors=True)
            q = alternatives.quix_app(bootstrap, topic, _fresh(workdir / "quix.duckdb"), state)
            quix.append(q.rate)
            nv = alternatives.naive_loop(
                bootstrap,
                topic,
                _fresh(workdir / "naive.duckdb"),
                max_records=cfg.naive_max_records,
                max_seconds=cfg.naive_max_seconds,
            )
            naive.append(nv.rate)
            naive_n = nv.records
            line += f", quix {q.rate:,.0f}/s, naive {nv.rate:,.0f}/s"
        log(line)

    f_default = Figure(
        "ceiling consumer (bare kafka-python + fastavro decode, writes nothing), kafka-python's default fetch settings",
        default_ceiling,
        "records/s",
    )
    f_settings = Figure("ceiling consumer with the projector's fetch settings", ceiling, "records/s")
    f_ceiling = max(f_default, f_settings, key=lambda f: f.median)
    which = "kafka-python's defaults" if f_ceiling is f_default else "the projector's settings"
    f_reader_ceiling = Figure(
        "the same consumer parsing batches with throughline's record reader (not a target; see the notes)",
        reader_ceiling,
        "records/s",
    )
    f_stream = Figure("projector, streaming (offset 0 to end, in process)", streaming, "records/s")
    f_replay = Figure("replay into a new file (`throughline.projector.replay.replay`, in process)", replay, "records/s")
    # Paired ratios: each repetition's projector (replay) over the same repetition's ceiling.
    stream_ratio = Figure(
        "projector / ceiling, per repetition",
        [a / b for a, b in zip(streaming, f_ceiling.samples, strict=True)],
        "ratio",
        "{:.2f}",
    )
    replay_ratio = Figure(
        "replay / ceiling, per repetition",
        [a / b for a, b in zip(replay, f_ceiling.samples, strict=True)],
        "ratio",
        "{:.2f}",
    )
    one = Section("throughput", "1. Projector and replay against the ceiling")
    one.figures = [f_default, f_settings, f_reader_ceiling, f_stream, f_replay, stream_ratio, replay_ratio]
    one.targets = [
        Target(
            "projector >= 0.8 of the ceiling", stream_ratio.median, 0.8, text=against_noise(stream_ratio.samples, 0.8)
        ),
        Target("replay >= 0.8 of the ceiling", replay_ratio.median, 0.8, text=against_noise(replay_ratio.samples, 0.8)),
    ]
    for t in one.targets:
        log(f"{t.name}: {t.value:.2f} ({t.text})")
    one.notes = [
        f"The two target ratios are medians of per-repetition ratios (each repetition's projector or replay over "
        f"the same repetition's ceiling, timed back to back): {reps} repetitions (`--ratio-repeat`), the "
        f"other figures of items 1 and 2 over the first {cfg.repeat} (`--repeat`). Whether a ratio is a clear "
        "pass, a clear miss or within the noise is read off a distribution-free confidence interval of the "
        "median (order statistics; the coverage is printed with it). Ratios per repetition: projector "
        + ", ".join(f"{x:.2f}" for x in stream_ratio.samples)
        + "; replay "
        + ", ".join(f"{x:.2f}" for x in replay_ratio.samples)
        + ".",
        f"Topic: {n:,} turns, {data.value_bytes / 2**20:,.0f} MiB of Avro values "
        f"(~{data.value_bytes // max(1, n):,} bytes each), {cfg.projects} projects x {cfg.threads} sources, "
        f"{cfg.partitions} partitions.",
        "The ceiling is the faster (by median) of the bare consumer with kafka-python's default fetch settings "
        + ", ".join(f"`{k}={v}`" for k, v in CONSUMER_SETTINGS.items())
        + " and with the projector's "
        + ", ".join(f"`{k}={v}`" for k, v in CEILING_SETTINGS.items())
        + f"; here: {which}. Both clocks start before the consumer connects and stop when the last record is "
        "decoded (ceiling) or committed (projector).",
        "The projector's consumer parses fetched record batches with throughline's own reader "
        "(`throughline.log.record_batch`), not kafka-python's per-record parser, which the ceiling uses as "
        "item 1 defines it. The third figure is the ceiling's consumer with that reader, so both comparisons "
        f"are on record (ratios of medians): projector / ceiling {f_stream.median / f_ceiling.median:.2f}, "
        f"projector / the same consumer with the record reader {f_stream.median / f_reader_ceiling.median:.2f}; "
        f"replay {f_replay.median / f_ceiling.median:.2f} and {f_replay.median / f_reader_ceiling.median:.2f}.",
    ]
    f_quix = Figure("Quix Streams app, DuckDB BatchingSink", quix, "records/s")
    f_naive = Figure(f"per-record insert + commit loop (first {naive_n:,} records)", naive, "records/s")
    two = Section("alternatives", "2. What a user would otherwise write")
    two.figures = [f_stream, f_quix, f_naive]
    two.targets = [
        Target("projector / Quix Streams > 1", f_stream.median / f_quix.median, 1.0, text="ratio of medians"),
        Target("projector / per-record loop > 1", f_stream.median / f_naive.median, 1.0, text="ratio of medians"),
    ]
    two.notes = [
        "Quix Streams 3.28 in its own pinned environment (`bench/peers.py`; it cannot share throughline's "
        "pydantic) as a subprocess (librdkafka consumer in a consumer group, `auto_offset_reset=earliest`, default "
        "5 s checkpoints): a custom `Deserializer` (fastavro, after the 10-byte single-object header) and a "
        "`BatchingSink` subclass writing each checkpoint's batch to DuckDB as one Arrow insert; clock from "
        "`Application.run()` to its return after the last record's checkpoint.",
        "The per-record loop: kafka-python consumer, fastavro decode, then per record `BEGIN; INSERT` the "
        "row; upsert the partition's next offset; `COMMIT`. It is timed over a bounded prefix "
        f"(at most {cfg.naive_max_records:,} records or {cfg.naive_max_seconds:.0f} s).",
        "Neither alternative checks digests, folds chains, deduplicates or quarantines; the projector does.",
    ]
    if wants_profile(cfg, one.targets + two.targets):
        with recording("projector, streaming (profile run)", workdir / "projector.pyspy") as got:
            run_projector(bootstrap, topic, workdir / "streaming.duckdb", n)
        _fresh(workdir / "streaming.duckdb")
        one.profiles.append(got[0].markdown())
        for t in one.targets + two.targets:
            if t.passed is False:
                t.bottleneck = got[0].bottleneck()
    return one, two, f_stream.median
