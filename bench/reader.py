"""Item 3: reader cost independent of history.

For each size (turns projected), a DuckDB projection is built directly in the projector's schema, with
no Kafka: ``sources`` chains (one per project, ``size / sources`` turns each) laid out in log order over
the topic's partitions, digests computed exactly as the projector computes them (content digest, chain
digest, ``page_key``). Producing 10 million records through Kafka would take most of the time budget on
two cores, so the builder writes the tables the projector's batch-apply path writes (``turns``,
``sources``, ``project_heads``, ``applied_offsets``, ``meta``; not ``turn_ids``, which no read touches)
in bulk from Parquet, and every run first checks, at a small size, that the builder's tables are
byte-identical to what ``DuckProjection.apply_batch`` writes for the same records.

Reads go through the real ``read_observer_turn_page`` over a read-only ``DuckProjection`` (what
``throughline read`` opens) and a ``FixedLog`` whose end offsets equal the applied offsets:

- snapshot: a first page (no after, no through) of a project, ``limit`` 10 and 100;
- delta: a first page whose after cursor is a random prefix of the project's chain (the reader pins
  the head as through and pages the range), ``limit`` 10 and 100.

Every timed read must answer ``ok`` with ``limit`` turns (verified digests), or the run fails.
"""

from __future__ import annotations

import multiprocessing
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import Config, Figure, Section, Target, human_count, log, percentile, wants_profile
from bench.profile import recording
from throughline.core.chain import CHAIN_ORIGIN, content_digest, next_chain_digest
from throughline.core.cursor import Cursor
from throughline.core.identity import project_sha256, source_sha256
from throughline.core.memory import FixedLog
from throughline.core.partitioning import partition_for
from throughline.core.turn import build_turn
from throughline.projector.store import TURN_COLUMNS, DuckProjection, LogRecord, is_milestone, page_key
from throughline.projector.store.files import connect
from throughline.reader import read_observer_turn_page
from throughline.schemas.codec import encode_turn

TOPIC = "bench.reader"
BASE_MICROS = 1_767_225_600_000_000
HOST, THREAD = "host-0", "thread-0"
_BODY = "the observer audits each completed turn and saves its cursor after a whole series of pages"
_INDEX_DDL = "CREATE INDEX turns_page_key ON turns (page_key)"
#: Item 3's target: a first page of the reader's default limit, in process, at the largest size.
FIRST_PAGE_LIMIT = 10
FIRST_PAGE_P50_MS, FIRST_PAGE_P99_MS = 3.0, 8.0


@dataclass(frozen=True)
class Layout:
    """Where every turn of a built projection sits."""

    sources: int
    length: int  # turns per source
    partitions: int
    body_bytes: int

    @property
    def total(self) -> int:
        """Turns projected."""
        return self.sources * self.length

    def project(self, s: int) -> str:
        """The project of source ``s`` (one source per project)."""
        return f"/bench/reader/project-{s:05d}"

    def partition_of(self, s: int) -> int:
        """The partition of source ``s``'s project."""
        return partition_for(project_sha256(self.project(s)), self.partitions)

    def sources_on(self) -> dict[int, list[int]]:
        """Sources per partition, ascending."""
        out: dict[int, list[int]] = {p: [] for p in range(self.partitions)}
        for s in range(self.sources):
            out[self.partition_of(s)].append(s)
        return out

    def ends(self) -> dict[int, int]:
        """End offset (== applied offset) per partition."""
        return {p: len(ss) * self.length for p, ss in self.sources_on().items()}

    def body(self, g: int) -> str:
        """The body of the turn at global log index ``g``."""
        text = f"#{g} {_BODY}"
        return (text * (1 + self.body_bytes // len(text)))[: self.body_bytes]


def _source_rows(layout: Layout, s: int, rank: int, n_on_partition: int) -> dict[str, list[Any]]:
    project_hash = project_sha256(layout.project(s))
    source = source_sha256(project_hash, HOST, THREAD)
    part = layout.partition_of(s)
    # The builder writes the projector's own ``turns`` layout: take its column names from the store.
    cols: dict[str, list[Any]] = {k: [] for k in ("page_key", *TURN_COLUMNS)}
    digest = CHAIN_ORIGIN
    for j in range(layout.length):
        seq = j + 1
        g = j * layout.sources + s
        turn_id = f"turn-{g:010d}"
        at = BASE_MICROS + g * 1000
        body = layout.body(g)
        content = content_digest(turn_id, at, body)
        digest = next_chain_digest(digest, content)
        cols["page_key"].append(page_key(source, seq))
        cols["source_sha256"].append(source)
        cols["seq"].append(seq)
        cols["project_sha256"].append(project_hash)
        cols["turn_id"].append(turn_id)
        cols["completed_at_us"].append(at)
        cols["body"].append(body)
        cols["body_bytes"].append(len(body.encode("utf-8")))
        cols["content_digest"].append(content)
        cols["chain_digest"].append(digest)
        cols["log_partition"].append(part)
        cols["log_offset"].append(j * n_on_partition + rank)
    return cols


_TURN_SCHEMA = pa.schema(
    [
        ("page_key", pa.int64()),
        ("source_sha256", pa.binary()),
        ("seq", pa.int64()),
        ("project_sha256", pa.binary()),
        ("turn_id", pa.string()),
        ("completed_at_us", pa.int64()),
        ("body", pa.string()),
        ("body_bytes", pa.int64()),
        ("content_digest", pa.binary()),
        ("chain_digest", pa.binary()),
        ("log_partition", pa.int32()),
        ("log_offset", pa.int64()),
    ]
)


def _write_source(args: tuple[Layout, int, int, int, str]) -> tuple[int, int, bytes, int, int, bytes]:
    """Worker: write one source's turns to Parquet; return its ``sources`` row as the projector writes
    it, at the chain's last milestone (s, length, digest, partition, offset, source)."""
    layout, s, rank, n_on, out = args
    cols = _source_rows(layout, s, rank, n_on)
    pq.write_table(pa.table(cols, schema=_TURN_SCHEMA), out, compression="none")
    # The first seq, and every seq that opens a page bucket, is a milestone of an unbroken chain.
    at = max(seq for seq in cols["seq"] if seq == 1 or is_milestone(seq))
    i = at - 1
    return s, at, cols["chain_digest"][i], cols["log_partition"][i], cols["log_offset"][i], cols["source_sha256"][i]


def build_projection(path: Path, layout: Layout, scratch: Path, *, workers: int = 2) -> float:
    """Write a projection of ``layout`` at ``path`` in bulk; return the seconds it took."""
    start = time.perf_counter()
    for p in (path, Path(str(path) + ".wal")):
        p.unlink(missing_ok=True)
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    with DuckProjection.open(path, topic=TOPIC) as proj:
        proj.bind_log(TOPIC, None, layout.partitions)
    on = layout.sources_on()
    jobs = []
    for _p, ss in on.items():
        for rank, s in enumerate(ss):
            jobs.append((layout, s, rank, len(ss), str(scratch / f"src-{s:05d}.parquet")))
    ctx = multiprocessing.get_context("spawn")  # fork would copy locks held by this process's other threads
    with ctx.Pool(max(1, workers)) as pool:
        heads = pool.map(_write_source, jobs, chunksize=1)
    con = connect(path, read_only=False)  # with the projection's row groups, as the projector writes them
    try:
        con.execute("BEGIN TRANSACTION")
        con.execute("DROP INDEX turns_page_key")
        glob = str(scratch / "*.parquet")
        con.execute(f"INSERT INTO turns SELECT * FROM read_parquet('{glob}')")  # noqa: S608 (our path)
        con.execute(_INDEX_DDL)
        for s, length, digest, part, offset, source in heads:
            project_hash = project_sha256(layout.project(s))
            con.execute(
                "INSERT INTO sources VALUES (?, ?, ?, ?, ?, ?, NULL, NULL, NULL)",
                [source, project_hash, length, digest, part, offset],
            )
            con.execute("INSERT INTO project_heads VALUES (?, ?)", [project_hash, source])
        for part, end in layout.ends().items():
            if end:
                con.execute("INSERT INTO applied_offsets VALUES (?, ?, ?, ?, ?, 0, 0, 0)", [TOPIC, part, end, end, end])
        con.execute("COMMIT")
        con.execute("CHECKPOINT")
    finally:
        con.close()
    shutil.rmtree(scratch, ignore_errors=True)
    return time.perf_counter() - start


def build_through_projector(path: Path, layout: Layout) -> float:
    """The same projection through ``DuckProjection.apply_batch`` (the projector's Kafka-free path)."""
    start = time.perf_counter()
    for p in (path, Path(str(path) + ".wal")):
        p.unlink(missing_ok=True)
    per_partition: dict[int, list[LogRecord]] = {p: [] for p in range(layout.partitions)}
    for j in range(layout.length):
        for s in range(layout.sources):
            g = j * layout.sources + s
            rec = build_turn(
                project=layout.project(s),
                host=HOST,
                thread=THREAD,
                turn_id=f"turn-{g:010d}",
                completed_at_micros=BASE_MICROS + g * 1000,
                body=layout.body(g),
            )
            part = layout.partition_of(s)
            recs = per_partition[part]
            recs.append(LogRecord(part, len(recs), rec.project_sha256, encode_turn(rec)))
    with DuckProjection.open(path, topic=TOPIC) as proj:
        proj.bind_log(TOPIC, None, layout.partitions)
        for part, recs in per_partition.items():
            for i in range(0, len(recs), 5000):
                proj.apply_batch(TOPIC, part, recs[i : i + 5000])
    return time.perf_counter() - start


def check_builder(workdir: Path) -> str:
    """Build a small layout both ways and compare the tables the reader reads; return a verdict."""
    layout = Layout(sources=12, length=150, partitions=3, body_bytes=64)
    a, b = workdir / "builder-bulk.duckdb", workdir / "builder-projector.duckdb"
    build_projection(a, layout, workdir / "builder-scratch")
    build_through_projector(b, layout)
    digests = []
    for p in (a, b):
        with DuckProjection.open(p, read_only=True) as proj:
            digests.append(proj.table_digests())
    tables = ("turns", "sources", "project_heads", "applied_offsets", "meta")
    differ = [t for t in tables if digests[0][t] != digests[1][t]]
    for p in (a, b):
        p.unlink(missing_ok=True)
    if differ:
        raise RuntimeError(f"the bulk builder disagrees with DuckProjection.apply_batch on {differ}")
    return (
        f"identical `{'`, `'.join(tables)}` tables (SHA-256 over all rows) to `DuckProjection.apply_batch` "
        f"for {layout.total:,} turns"
    )


@dataclass
class ReadTimes:
    """Latencies (ms) of one kind of read at one size."""

    kind: str
    limit: int
    size: int
    ms: list[float]


def _delta_cursors(path: Path, layout: Layout, count: int, limit: int, rng: random.Random) -> list[tuple[str, str]]:
    """(project, after cursor) pairs at random prefixes, read from the projection (outside the clock)."""
    out: list[tuple[str, str]] = []
    con = duckdb.connect(str(path), read_only=True)
    try:
        for _ in range(count):
            s = rng.randrange(layout.sources)
            k = rng.randint(1, max(1, layout.length - limit - 1))
            project_hash = project_sha256(layout.project(s))
            source = source_sha256(project_hash, HOST, THREAD)
            row = con.execute(
                "SELECT chain_digest, log_partition, log_offset FROM turns WHERE page_key = ? "
                "AND source_sha256 = ? AND seq = ?",
                [page_key(source, k), source, k],
            ).fetchone()
            assert row is not None
            cursor = Cursor(project_hash, source, k, bytes(row[0]), int(row[1]), int(row[2]))
            out.append((layout.project(s), cursor.encode()))
    finally:
        con.close()
    return out


def time_reads(path: Path, layout: Layout, reads: int, seed: int = 11) -> list[ReadTimes]:
    """Time snapshot and delta first pages (limit 10 and 100) through ``read_observer_turn_page``."""
    rng = random.Random(seed)
    key = b"k" * 32
    log_view = FixedLog(partitions=layout.partitions, ends=layout.ends())
    results: list[ReadTimes] = []
    warm = max(5, reads // 20)
    with DuckProjection.open(path, read_only=True) as proj:
        for limit in (10, 100):
            if layout.length < limit + 2:
                continue
            jobs: dict[str, list[tuple[str, str | None]]] = {
                "snapshot": [(layout.project(rng.randrange(layout.sources)), None) for _ in range(reads + warm)],
                "delta": list(_delta_cursors(path, layout, reads + warm, limit, rng)),
            }
            for kind, calls in jobs.items():
                ms: list[float] = []
                for i, (project, after) in enumerate(calls):
                    t0 = time.perf_counter()
                    page = read_observer_turn_page(
                        project=project,
                        after_cursor=after,
                        limit=limit,
                        projection=proj,
                        log=log_view,
                        token_key=key,
                        wait_timeout=0.0,
                    )
                    dt = (time.perf_counter() - t0) * 1000
                    if page.status != "ok" or len(page.turns) != limit:
                        raise RuntimeError(f"{kind} read answered {page.status} with {len(page.turns)} turns")
                    if i >= warm:
                        ms.append(dt)
                results.append(ReadTimes(kind, limit, layout.total, ms))
    return results


def measure(cfg: Config, workdir: Path, progress: Callable[[str], None] = log) -> Section:
    """Build each size once, time reads ``cfg.repeat`` times, report p50/p99 and the largest/smallest ratio."""
    section = Section("reader", "3. Reader cost independent of history")
    section.notes.append("Builder check: " + check_builder(workdir))
    by_key: dict[tuple[str, int], dict[int, list[tuple[float, float]]]] = {}
    builds: list[str] = []
    sizes = list(cfg.reader_sizes)
    last: tuple[Path, Layout] | None = None
    for size in sizes:
        length = max(1, size // cfg.reader_sources)
        layout = Layout(cfg.reader_sources, length, cfg.partitions, cfg.reader_body_bytes)
        path = workdir / f"reader-{human_count(size)}.duckdb"
        seconds = build_projection(path, layout, workdir / "reader-scratch")
        mib = path.stat().st_size / 2**20
        builds.append(f"{human_count(layout.total)}: built in {seconds:.1f} s, {mib:,.0f} MiB")
        progress(f"reader: built {layout.total:,} turns in {seconds:.1f} s ({mib:,.0f} MiB)")
        for rep in range(cfg.repeat):
            for rt in time_reads(path, layout, cfg.reader_reads, seed=11 + rep):
                by_key.setdefault((rt.kind, rt.limit), {}).setdefault(size, []).append(
                    (percentile(rt.ms, 50), percentile(rt.ms, 99))
                )
            progress(f"reader: {human_count(size)} rep {rep + 1} done")
        if last is not None:
            _drop(last[0])
        last = (path, layout)
    header = (
        "| read | limit | "
        + " | ".join(f"{human_count(s)} p50 / p99 (ms)" for s in sizes)
        + " | p99 largest / smallest |"
    )
    lines = [header, "|" + "---|" * (len(sizes) + 3)]
    for (kind, limit), per_size in by_key.items():
        cells = []
        p50s: dict[int, float] = {}
        p99s: dict[int, float] = {}
        for s in sizes:
            samples = per_size.get(s)
            if not samples:
                cells.append("n/a")
                continue
            p50 = Figure("p50", [x[0] for x in samples], "ms", "{:.2f}").median
            p99 = Figure("p99", [x[1] for x in samples], "ms", "{:.2f}").median
            p50s[s], p99s[s] = p50, p99
            cells.append(f"{p50:.2f} / {p99:.2f}")
        ratio = p99s[sizes[-1]] / p99s[sizes[0]] if sizes[0] in p99s and sizes[-1] in p99s else None
        lines.append(
            f"| {kind} | {limit} | " + " | ".join(cells) + f" | {'n/a' if ratio is None else f'{ratio:.2f}'} |"
        )
        section.targets.append(
            Target(
                f"{kind} limit {limit}: p99 at {human_count(sizes[-1])} within 2x of p99 at {human_count(sizes[0])}",
                ratio,
                2.0,
                higher_is_better=False,
                text="p99 ratio",
            )
        )
        if limit == FIRST_PAGE_LIMIT:  # item 3's target: a first page of the default limit, in process
            largest = human_count(sizes[-1])
            section.targets += [
                Target(
                    f"{kind} first page (limit {limit}) in process p50 <= {FIRST_PAGE_P50_MS:g} ms at {largest}",
                    p50s.get(sizes[-1]),
                    FIRST_PAGE_P50_MS,
                    higher_is_better=False,
                    text="ms",
                ),
                Target(
                    f"{kind} first page (limit {limit}) in process p99 <= {FIRST_PAGE_P99_MS:g} ms at {largest}",
                    p99s.get(sizes[-1]),
                    FIRST_PAGE_P99_MS,
                    higher_is_better=False,
                    text="ms",
                ),
            ]
    section.tables.append("\n".join(lines))
    if last is not None:
        if wants_profile(cfg, section.targets):
            with recording(
                f"reads at {human_count(last[1].total)} turns (profile run)", workdir / "reader.pyspy"
            ) as got:
                time_reads(last[0], last[1], cfg.reader_reads, seed=99)
            section.profiles.append(got[0].markdown())
            for t in section.targets:
                if t.passed is False:
                    t.bottleneck = got[0].bottleneck()
        _drop(last[0])
    section.notes.append(
        f"{cfg.reader_sources} sources (one per project), chains of size/{cfg.reader_sources} turns, "
        f"{cfg.reader_body_bytes}-byte bodies at every size, {cfg.partitions} partitions; "
        f"{cfg.reader_reads} timed reads per cell and repetition (after a warm-up), random projects and "
        "random after-cursor positions; p50/p99 are medians over the repetitions."
    )
    section.notes.append(
        "The projections are built without Kafka (producing 10 million records through the broker would take "
        "most of the time budget on two cores): `bench/reader.py` computes every digest as the projector does "
        "and bulk-inserts the rows the projector's batch-apply path writes (`turns` with its `page_key` index, "
        "`sources`, `project_heads`, `applied_offsets`, `meta`; not `turn_ids`, which no read touches), and the "
        "builder check above proves those tables identical to `DuckProjection.apply_batch`'s. Reads use a "
        "`FixedLog` whose end offsets equal the applied offsets."
    )
    section.notes.append("Builds (bulk, not timed as reads): " + "; ".join(builds) + ".")
    return section


def _drop(path: Path) -> None:
    for p in (path, Path(str(path) + ".wal")):
        p.unlink(missing_ok=True)
