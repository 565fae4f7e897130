"""The one command: ``.venv/bin/python -m bench [--quick] [sizes...]`` runs every measurement against a
real Kafka broker and writes ``docs/benchmarks.md``; ``python -m bench compression`` runs item 7 alone;
``python -m bench member-join`` runs item 10 (a member joining a ``serve --group``: from a peer's snapshot
against from offset 0), which is not part of the default run (about an hour at its default sizes, 1M and 10M), and
prints its section.

The broker is ``THROUGHLINE_TEST_BOOTSTRAP_SERVERS`` when set, else a Kafka 4.1 broker started (and
stopped) here by ``throughline.testing.kafka``. Every topic this run creates starts with ``bench.``;
DuckDB files live in ``--workdir`` and are removed as the run goes.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from bench.common import (
    Config,
    Section,
    Workload,
    broker,
    delete_topics,
    encode_workload,
    fill_topic,
    kafka_version,
    loadavg,
    log,
    new_topic_name,
    parse_count,
)

MEASUREMENTS = ("producer", "throughput", "reader", "freshness", "memory", "compression", "streams")


def _counts(text: str) -> tuple[int, ...]:
    values = tuple(parse_count(t) for t in text.split(",") if t.strip())
    if not values:
        raise argparse.ArgumentTypeError("give at least one size")
    return values


def _rates(text: str) -> tuple[float | None, ...]:
    values: list[float | None] = []
    for t in text.split(","):
        t = t.strip().lower()
        if not t:
            continue
        if t == "half":
            values.append(None)
            continue
        try:
            values.append(float(parse_count(t)))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    if not values:
        raise argparse.ArgumentTypeError("give at least one rate")
    return tuple(values)


def parse_args(argv: Sequence[str]) -> Config:
    """Parse the command line into a ``Config``."""
    p = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="small sizes, one repetition (a smoke run, < 2 minutes)")
    p.add_argument("--repeat", type=int, help="repetitions of every measurement (median reported; default 3)")
    p.add_argument("--turns", type=parse_count, help="records of the throughput topic (default 200k)")
    p.add_argument("--body-bytes", type=int, help="body size of the throughput topic's turns (default 1024)")
    p.add_argument("--reader-sizes", type=_counts, help="turns projected for the reader (default 10k,1M,10M)")
    p.add_argument("--reader-reads", type=int, help="timed reads per reader cell (default 200)")
    p.add_argument(
        "--ratio-repeat",
        type=int,
        help="interleaved repetitions of the target ratios of item 1 (ceiling, projector, replay) and item 5 (default 7, --quick 1)",
    )
    p.add_argument(
        "--freshness-rates",
        type=_rates,
        help="steady ingest rates of the freshness sweep, turns/s; 'half' is half the projector's measured "
        "capacity (default 10,100,1k,5k,half; --quick 100,1k)",
    )
    p.add_argument("--freshness-projects", type=_counts, help="projects per freshness cell (default 1,64)")
    p.add_argument(
        "--freshness-seconds", type=float, help="measured seconds per freshness cell (default 10, --quick 3)"
    )
    p.add_argument(
        "--memory-sizes", type=_counts, help="topic sizes for the projector's peak RSS (default 50k,150k,300k)"
    )
    p.add_argument("--only", help=f"comma-separated subset of {','.join(MEASUREMENTS)}")
    p.add_argument(
        "--profile",
        choices=("auto", "none", "all"),
        default=None,
        help="py-spy profiles: of missed targets (auto, the default of a full run), none (default of --quick), or all; "
        "item 8 profiles its 1,000/s and 5,000/s freshness cells (py-spy on serve, JFR on Kafka Streams) unless none",
    )
    p.add_argument("--report", type=Path, help="where to write the report (default docs/benchmarks.md)")
    p.add_argument("--workdir", type=Path, help="scratch folder for DuckDB files (default .cache/bench)")
    a = p.parse_args(argv)
    cfg = Config.quick_config() if a.quick else Config()
    changes: dict[str, object] = {}
    names = (
        "repeat",
        "ratio_repeat",
        "turns",
        "body_bytes",
        "reader_sizes",
        "reader_reads",
        "freshness_rates",
        "freshness_projects",
        "freshness_seconds",
        "memory_sizes",
        "report",
        "workdir",
    )
    for name in names:
        value = getattr(a, name)
        if value is not None:
            changes[name] = value
    if a.only:
        only = tuple(x.strip() for x in a.only.split(",") if x.strip())
        unknown = [x for x in only if x not in MEASUREMENTS]
        if unknown:
            p.error(f"unknown measurement(s) {unknown}; choose from {MEASUREMENTS}")
        changes["only"] = only
    cfg = replace(cfg, **changes, argv=tuple(argv))  # type: ignore[arg-type]
    if cfg.repeat < 1 or cfg.ratio_repeat < 1:
        p.error("--repeat and --ratio-repeat must be at least 1")
    if cfg.freshness_seconds <= 0:
        p.error("--freshness-seconds must be positive")
    return replace(cfg, profile=a.profile or ("none" if cfg.quick else "auto"))


def _wanted(cfg: Config, name: str) -> bool:
    return not cfg.only or name in cfg.only


def _section(
    name: str, fn: Callable[[], Section | tuple[Section, ...]], sections: list[Section], failures: list[tuple[str, str]]
) -> tuple[Section, ...]:
    """Run one measurement, stamping time and load; a failure is reported, not fatal."""
    log(f"--- {name} (load {loadavg():.1f})")
    before = loadavg()
    start = time.perf_counter()
    try:
        result = fn()
    except Exception:
        err = traceback.format_exc()
        log(f"{name} FAILED:\n{err}")
        failures.append((name, err.strip().splitlines()[-1]))
        return ()
    got = result if isinstance(result, tuple) else (result,)
    elapsed = time.perf_counter() - start
    for s in got:
        s.seconds = elapsed / len(got)
        s.load = (before, loadavg())
        sections.append(s)
    return got


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite; return the exit code (0 unless a measurement failed)."""
    from bench import compression, freshness, member_join, memory, producer, projector, reader, report, streams_bench

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["compression"]:  # the compression item alone, printed (bench/compression.py)
        return compression.main(args[1:])
    if args[:1] == ["member-join"]:  # item 10 alone, printed (bench/member_join.py); never in the default run
        return member_join.main(args[1:])
    cfg = parse_args(args)
    command = ".venv/bin/python -m bench" + ("" if not args else " " + shlex.join(args))
    started = report.now()
    t0 = time.perf_counter()
    load_start = loadavg()
    work = cfg.workdir
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    sections: list[Section] = []
    failures: list[tuple[str, str]] = []
    capacity: float | None = None
    log(f"sizes: {cfg}")
    with broker() as bootstrap:
        kafka = kafka_version(bootstrap)
        topics: list[str] = []
        data = turns = None
        try:
            if _wanted(cfg, "producer") or _wanted(cfg, "throughput") or _wanted(cfg, "streams"):
                log(f"building the workload: {cfg.turns:,} turns")
                wl = Workload(cfg.turns, body_bytes=cfg.body_bytes, projects=cfg.projects, threads=cfg.threads)
                turns = list(wl.records())
                data = encode_workload(wl, cfg.partitions)
            if _wanted(cfg, "producer"):
                assert turns is not None and data is not None
                made, encoded = turns, data  # narrowed names: a lambda does not keep an assert's narrowing
                _section("producer", lambda: producer.measure(cfg, bootstrap, made, encoded), sections, failures)
            topic = ""
            if _wanted(cfg, "throughput") or _wanted(cfg, "streams"):
                assert data is not None
                topic = new_topic_name("throughput")
                topics.append(topic)
                log(f"filling {topic}")
                fill_topic(bootstrap, topic, data, cfg.partitions)
            if _wanted(cfg, "throughput"):
                filled = data
                assert filled is not None

                def _throughput() -> tuple[Section, ...]:
                    nonlocal capacity
                    one, two, capacity = projector.measure(cfg, bootstrap, topic, filled, work)
                    return one, two

                _section("throughput", _throughput, sections, failures)
            if _wanted(cfg, "streams"):  # item 8: the same topic, beside Kafka Streams
                items = data
                assert items is not None
                _section(
                    "streams", lambda: streams_bench.measure(cfg, bootstrap, topic, items, work), sections, failures
                )
            turns = None  # free the workload's memory before the reader builds its projections
            if _wanted(cfg, "reader"):
                _section("reader", lambda: reader.measure(cfg, work), sections, failures)
            if _wanted(cfg, "freshness"):
                if capacity is None and None in cfg.freshness_rates:
                    capacity = _capacity(cfg, bootstrap, work, topics)
                cap = capacity
                _section("freshness", lambda: freshness.measure(cfg, bootstrap, cap, work), sections, failures)
            if _wanted(cfg, "memory"):
                _section("memory", lambda: memory.measure(cfg, bootstrap, work), sections, failures)
            if _wanted(cfg, "compression"):
                _section("compression", lambda: compression.measure(cfg, bootstrap), sections, failures)
        finally:
            delete_topics(bootstrap, topics)
    seconds = time.perf_counter() - t0
    text = report.render(
        cfg,
        sections,
        kafka=kafka,
        command=command,
        started=started,
        seconds=seconds,
        load=(load_start, loadavg()),
        failures=failures,
    )
    cfg.report.parent.mkdir(parents=True, exist_ok=True)
    cfg.report.write_text(text, encoding="utf-8")
    shutil.rmtree(work, ignore_errors=True)
    log(f"wrote {cfg.report} in {seconds / 60:.1f} minutes")
    for s in sections:
        for t in s.targets:
            log(f"{'PASS' if t.passed else 'MISS' if t.passed is False else 'n/a '} {t.name}: {t.value}")
    return 1 if failures else 0


def _capacity(cfg: Config, bootstrap: str, work: Path, topics: list[str]) -> float:
    """The projector's rate on a small topic (at most 50k turns of the throughput topic's kind), when the
    throughput measurement did not run and the freshness sweep needs half of it."""
    from bench.projector import run_projector

    n = min(cfg.turns, 50_000)
    wl = Workload(n, body_bytes=cfg.body_bytes, projects=cfg.projects, threads=cfg.threads, label="cap")
    data = encode_workload(wl, cfg.partitions)
    topic = new_topic_name("capacity")
    topics.append(topic)
    fill_topic(bootstrap, topic, data, cfg.partitions)
    seconds = run_projector(bootstrap, topic, work / "capacity.duckdb", n)
    log(f"projector capacity (no throughput run): {n / seconds:,.0f} records/s")
    return n / seconds


if __name__ == "__main__":
    sys.exit(main())
