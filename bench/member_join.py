"""A member joining a ``serve --group``: from a peer's projection snapshot against from offset 0
(docs/scale-out.md "A member joins: bootstrap from a peer"; docs/benchmarks.md, item 10).

    .venv/bin/python -m bench member-join [--sizes 1M,10M] [--repeat 3,2] [--until 10:50] [--quick]

Not part of the default ``python -m bench`` run (at 10M turns it took 42 minutes on a loaded 2-core machine, 15 of them filling the topic). Against a
real broker (``THROUGHLINE_TEST_BOOTSTRAP_SERVERS``, else one started here), for each size N:

1. a topic of ``--partitions`` partitions filled with N turns of the bench's ``Workload`` (small bodies,
   ``--body-bytes``), by two producer processes that each encode and send half of the partitions;
2. member A (``serve --group G``, an empty file) joins alone and projects everything: the figure of a
   whole-topic projection by one member, and the peer B asks for snapshots;
3. repetitions, each a pair of joins, in alternating order: member B starts with an empty file once with
   peer bootstrap (the default) and once with ``THROUGHLINE_GROUP_PEER_BOOTSTRAP=off`` (catching up from
   offset 0, as before peer bootstrap). A join is timed from just before B's process is started until B
   is **live** on the partitions it was given, as its ``/readyz`` says: its ``group`` names A and B in one
   generation, ``held`` is not empty and ``catchingUp`` is empty (every held partition's applied offset
   has reached the log's end offset since B gained it: from then on B answers those partitions' reads
   itself instead of forwarding them). B is then stopped (SIGTERM: it leaves the group), its file is
   removed, and A settles alone again before the next join;
4. once per size, where the snapshot path's time goes, step by step, for each partition in turn (the
   joiner's own sequence, outside it): fetch ``GET /v1/admin/snapshot?partitions=P`` from A (A writes the
   partition's Parquet files and a tar, then sends it), unpack, verify (every file's SHA-256), load into
   one scratch file (``DuckProjection.load_cut_partitions``).

Copies are the default (2): with two members B is given every partition, a full replica. The ratio of a
pair is snapshot time / replay time; the target (the issue's) is <= 0.15x at 10M. ``--until HH:MM``
(UTC): a later pair of a size starts only when the previous pair's duration still fits before it (the
first pair of a size always runs). Prints a markdown section; per-join JSON lines go to the log.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import multiprocessing
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    PYTHON,
    REPO,
    Section,
    Target,
    Workload,
    against_noise,
    bare_producer,
    broker,
    create_topic,
    delete_topics,
    end_offsets,
    human_count,
    loadavg,
    log,
    new_topic_name,
    parse_count,
)
from bench.freshness_rig import stop_serve
from throughline.testing.kafka.support import free_port

KEY_HEX = "6b" * 32
TARGET = 0.15
LOADED = re.compile(r"member bootstrap: loaded partition (\d+) from \S+ at offset (\d+) in ([\d.]+)s")
BOOT_LINE = "member bootstrap"
JOIN_BOUND_S = 3 * 3600.0  # one join, or A's whole projection, at most
POLL_S = 0.1  # how often /readyz is asked: the resolution of a join's time


# ------------------------------------------------------------------------------------------ the topic


def _fill_share(args: tuple[str, str, Workload, int, frozenset[int]]) -> int:
    """One producer process: encode and send the turns of ``mine`` (partitions), in log order."""
    from throughline.core.identity import project_sha256
    from throughline.core.partitioning import partition_for
    from throughline.schemas.codec import encode_turn

    bootstrap, topic, workload, partitions, mine = args
    part = {
        workload.project(k): partition_for(project_sha256(workload.project(k)), partitions)
        for k in range(workload.projects)
    }
    keep = [part[workload.project(s // workload.threads)] in mine for s in range(workload.projects * workload.threads)]
    producer = bare_producer(bootstrap)
    sent = 0
    try:
        for rec in workload.records(lambda s: keep[s]):
            producer.send(topic, value=encode_turn(rec), key=rec.project_sha256, partition=part[rec.project])
            sent += 1
        producer.flush(timeout=600)
    finally:
        producer.close(timeout=30)
    return sent


def fill(bootstrap: str, topic: str, workload: Workload, partitions: int, workers: int = 2) -> dict[int, int]:
    """Create ``topic`` and write ``workload`` into it from ``workers`` processes, each owning a share of
    the partitions (so every partition's turns stay in log order); returns the end offsets."""
    create_topic(bootstrap, topic, partitions)
    shares = [frozenset(p for p in range(partitions) if p % workers == w) for w in range(workers)]
    ctx = multiprocessing.get_context("spawn")  # fork would copy locks held by this process's other threads
    with ctx.Pool(workers) as pool:
        sent = sum(pool.map(_fill_share, [(bootstrap, topic, workload, partitions, s) for s in shares]))
    ends = end_offsets(bootstrap, topic)
    if sent != workload.turns or sum(ends.values()) != workload.turns:
        raise RuntimeError(f"{topic}: sent {sent}, the log holds {sum(ends.values())}, expected {workload.turns}")
    return ends


# ------------------------------------------------------------------------------------------ members


class Member:
    """One ``serve --group`` process on loopback, its stderr in ``log_path``; ``started`` is taken just
    before the process is."""

    def __init__(
        self, bootstrap: str, topic: str, group: str, db: Path, log_path: Path, *, peer_bootstrap: bool
    ) -> None:
        self.db = db
        self.log_path = log_path
        self.url = f"http://127.0.0.1:{free_port()}"
        env = {
            **os.environ,
            "THROUGHLINE_BOOTSTRAP_SERVERS": bootstrap,
            "THROUGHLINE_TOPIC": topic,
            "THROUGHLINE_DB": str(db),
            "THROUGHLINE_TOKEN_KEY": KEY_HEX,
            "THROUGHLINE_GROUP_PEER_BOOTSTRAP": "on" if peer_bootstrap else "off",
        }
        env.pop("THROUGHLINE_AUTH_TOKEN", None)  # loopback without a token: every request is the admin's
        argv = [PYTHON, "-m", "throughline.cli", "serve", "--port", self.url.rsplit(":", 1)[1]]
        argv += ["--group", group, "--advertise", self.url]
        with open(log_path, "w", encoding="utf-8") as err:
            self.started = time.monotonic()
            self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err, cwd=REPO)

    def readyz(self) -> dict[str, Any] | None:
        """``/readyz``'s document (200 or 503 alike), or ``None`` while nothing listens yet."""
        try:
            with urllib.request.urlopen(self.url + "/readyz", timeout=30) as response:
                doc: dict[str, Any] = json.loads(response.read())
                return doc
        except urllib.error.HTTPError as exc:
            with exc:
                body: dict[str, Any] = json.loads(exc.read() or b"{}")
                return body
        except OSError:
            return None

    def stderr(self) -> str:
        """What the member logged so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        """SIGTERM (the member leaves the group at once), then SIGKILL after a minute."""
        stop_serve(self.proc, grace=60.0)


def live_on(doc: dict[str, Any] | None, urls: set[str]) -> list[int] | None:
    """The partitions a member is live on when its ``/readyz`` names exactly ``urls`` as the group's
    members, it holds something and catches up on nothing; else ``None``."""
    group = (doc or {}).get("group") or {}
    if not group.get("joined") or not group.get("members"):
        return None
    if {m["url"] for m in group["members"]} != urls:
        return None
    held = group.get("held") or []
    if not held or group.get("catchingUp") != [] or group.get("heldLag") != 0:
        return None
    return sorted(held)


def wait_live(member: Member, urls: set[str], bound: float = JOIN_BOUND_S) -> tuple[float, list[int]]:
    """Seconds from ``member.started`` until it is live (``live_on``), and the partitions it holds; waits
    at most ``bound`` seconds from this call."""
    deadline = time.monotonic() + bound
    for _ in range(int(bound / POLL_S) + 1):
        held = live_on(member.readyz(), urls)
        if held is not None:
            return time.monotonic() - member.started, held
        if member.proc.poll() is not None:
            raise RuntimeError(f"{member.url} exited {member.proc.returncode}: {member.stderr()[-3000:]}")
        if time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    raise RuntimeError(f"{member.url} was not live within {bound:.0f} s: {member.stderr()[-3000:]}")


def remove_file(db: Path) -> None:
    """A member's file, its WAL and whatever temporary directories it left beside them."""
    for path in (db, db.with_name(db.name + ".wal"), *db.parent.glob(f".{db.name}.*")):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------ one size


@dataclass
class Join:
    """One timed join."""

    path: str  # "snapshot" or "replay"
    seconds: float
    held: list[int]
    boot_seconds: float  # the member's own "loaded partition ... in X s" lines, summed (0 for replay)
    loaded: int  # partitions it loaded from a snapshot
    load: tuple[float, float]


@dataclass
class SizeResult:
    """Everything measured at one size."""

    turns: int
    ends: dict[int, int]
    fill_seconds: float
    a_seconds: float
    pairs: list[tuple[Join, Join]] = field(default_factory=list)  # (snapshot, replay)
    breakdown: list[dict[str, float]] = field(default_factory=list)
    file_bytes: int = 0

    def ratios(self) -> list[float]:
        """snapshot / replay of each pair."""
        return [s.seconds / r.seconds for s, r in self.pairs]


def _join(
    bootstrap: str, topic: str, group: str, a: Member, work: Path, *, peer_bootstrap: bool, logs: Path | None = None
) -> Join:
    """Start member B on an empty file, time it until live, stop it; its log is copied into ``logs``."""
    path = "snapshot" if peer_bootstrap else "replay"
    db = work / "b.duckdb"
    remove_file(db)
    before = loadavg()
    b = Member(bootstrap, topic, group, db, work / f"b-{path}.log", peer_bootstrap=peer_bootstrap)
    try:
        seconds, held = wait_live(b, {a.url, b.url})
    finally:
        b.stop()
    text = b.stderr()
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
        kept = logs / f"b-{path}-{time.strftime('%H%M%S')}.log"
        shutil.copyfile(b.log_path, kept)
        log(f"B's log kept in {kept}")
    loaded = {int(m.group(1)): float(m.group(3)) for m in LOADED.finditer(text)}
    if not peer_bootstrap and BOOT_LINE in text:  # the switch did not hold: the baseline would be wrong
        raise RuntimeError(f"peer bootstrap was off, yet the member tried it: {text[-3000:]}")
    if peer_bootstrap and sorted(loaded) != held:
        log(f"note: the member loaded {sorted(loaded)} of {held} from a snapshot (the rest from the log)")
    join = Join(path, seconds, held, sum(loaded.values()), len(loaded), (before, loadavg()))
    log(
        json.dumps(
            {
                "join": path,
                "seconds": round(seconds, 2),
                "held": held,
                "boot_s": round(join.boot_seconds, 2),
                "loaded": len(loaded),
                "load": [round(x, 2) for x in join.load],
            }
        )
    )
    remove_file(db)
    wait_live(a, {a.url}, bound=600.0)  # A alone again, live on everything: the next join starts as this one
    return join


def breakdown(a: Member, topic: str, partitions: int, work: Path) -> list[dict[str, float]]:
    """Fetch, unpack, verify and load each partition's snapshot in turn into one scratch file, timed."""
    from throughline.projector.cut_load import verify_cut
    from throughline.projector.store import DuckProjection
    from throughline.serve.cut_api import fetch_cut, unpack_cut

    rows: list[dict[str, float]] = []
    scratch = work / "breakdown.duckdb"
    remove_file(scratch)
    projection: DuckProjection | None = None
    try:
        for p in range(partitions):
            tmp = Path(tempfile.mkdtemp(prefix=".breakdown-", dir=work))
            try:
                t0 = time.monotonic()
                fetch_cut(f"{a.url}/v1/admin/snapshot?partitions={p}", tmp / "cut.tar", token=None, context=None)
                t1 = time.monotonic()
                tar_bytes = (tmp / "cut.tar").stat().st_size
                unpack_cut(tmp / "cut.tar", tmp / "cut")
                (tmp / "cut.tar").unlink()
                t2 = time.monotonic()
                manifest = verify_cut(tmp / "cut")
                t3 = time.monotonic()
                if projection is None:
                    projection = DuckProjection.open(scratch, topic=topic)
                    projection.bind_log(topic, manifest.topic_id, partitions)
                projection.load_cut_partitions(tmp / "cut", manifest)
                t4 = time.monotonic()
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            row = {"partition": p, "fetch": t1 - t0, "unpack": t2 - t1, "verify": t3 - t2, "load": t4 - t3}
            row["mb"] = tar_bytes / 1e6
            log(json.dumps({"breakdown": {k: round(v, 2) for k, v in row.items()}}))
            rows.append(row)
    finally:
        if projection is not None:
            projection.close()
        remove_file(scratch)
    return rows


def measure_size(bootstrap: str, turns: int, repeat: int, args: argparse.Namespace, until: float | None) -> SizeResult:
    """Fill a topic, run member A, then the alternated pairs of joins and the breakdown; clean up."""
    workload = Workload(turns, body_bytes=args.body_bytes, projects=args.projects, label="join")
    topic, group = new_topic_name(f"join-{human_count(turns)}"), f"bench-join-{os.getpid()}-{turns}"
    work = Path(tempfile.mkdtemp(prefix=f"join-{human_count(turns)}-", dir=args.workdir))
    a: Member | None = None
    try:
        log(f"filling {topic}: {turns:,} turns, {args.partitions} partitions, {args.body_bytes}-byte bodies")
        t0 = time.monotonic()
        ends = fill(bootstrap, topic, workload, args.partitions)
        result = SizeResult(turns, ends, time.monotonic() - t0, 0.0)
        log(f"filled in {result.fill_seconds:.0f} s; member A projects everything")
        a = Member(bootstrap, topic, group, work / "a.duckdb", work / "a.log", peer_bootstrap=True)
        result.a_seconds, held = wait_live(a, {a.url})
        if held != list(range(args.partitions)):
            raise RuntimeError(f"member A alone holds {held}")
        result.file_bytes = (work / "a.duckdb").stat().st_size
        log(f"A live on everything in {result.a_seconds:.1f} s ({result.file_bytes / 1e6:,.0f} MB file)")
        for rep in range(repeat):
            started = time.monotonic()
            order = (True, False) if rep % 2 == 0 else (False, True)
            joins = {on: _join(bootstrap, topic, group, a, work, peer_bootstrap=on, logs=args.logs) for on in order}
            result.pairs.append((joins[True], joins[False]))
            took = time.monotonic() - started
            if until is not None and rep + 1 < repeat and time.time() + took > until:
                log(f"stopping after {rep + 1} pair(s): another ({took:.0f} s) would end past --until")
                break
        snapshot_join = max(p[0].seconds for p in result.pairs)
        if until is not None and time.time() + 2 * snapshot_join > until:
            log("no breakdown: it would end past --until")
        elif not args.no_breakdown:
            result.breakdown = breakdown(a, topic, args.partitions, work)
        return result
    finally:
        if a is not None:
            a.stop()
        delete_topics(bootstrap, [topic])
        shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------------------ the report


def _spread(values: Sequence[float], fmt: str = "{:.1f}") -> str:
    text = fmt.format(statistics.median(values))
    if len(values) > 1:
        text += f" ({fmt.format(min(values))}..{fmt.format(max(values))})"
    return text


def section(results: Sequence[SizeResult], args: argparse.Namespace) -> Section:
    """The results as item 10 of docs/benchmarks.md."""
    s = Section("member_join", "10. A member joining: from a peer's snapshot against from offset 0")
    rows = [
        "| turns | pairs | from a peer's snapshot, s | partitions loaded from a snapshot | from offset 0, s "
        "| snapshot / replay, each pair | median ratio | member A alone from offset 0, s | load avg during the joins |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        snap = [p[0].seconds for p in r.pairs]
        replay = [p[1].seconds for p in r.pairs]
        loads = [x for p in r.pairs for j in p for x in j.load]
        rows.append(
            f"| {human_count(r.turns)} | {len(r.pairs)} | {_spread(snap)} | "
            f"{', '.join(f'{p[0].loaded}/{len(p[0].held)}' for p in r.pairs)} | {_spread(replay)} | "
            f"{', '.join(f'{x:.3f}' for x in r.ratios())} | {statistics.median(r.ratios()):.3f} | "
            f"{r.a_seconds:.1f} | {min(loads):.1f}..{max(loads):.1f} |"
        )
    s.tables.append("\n".join(rows))
    for r in results:
        if not r.breakdown:
            continue
        steps = ("fetch", "unpack", "verify", "load")
        total = {k: sum(row[k] for row in r.breakdown) for k in (*steps, "mb")}
        boot = [p[0].boot_seconds for p in r.pairs]
        lines = [
            f"Where the snapshot path's time goes at {human_count(r.turns)} (one pass, partition by partition "
            "outside the joiner; the joiner's own log lines give its fetch + verify + load per partition):",
            "",
            "| step | seconds, all partitions | share |",
            "|---|---|---|",
        ]
        whole = sum(total[k] for k in steps)
        for k in steps:
            lines.append(f"| {k} | {total[k]:.1f} | {total[k] / whole:.0%} |")
        lines.append(f"| (snapshot tars: {total['mb']:,.0f} MB in all) | {whole:.1f} | |")
        median_join = statistics.median(p[0].seconds for p in r.pairs)
        lines += [
            "",
            f"In the joins themselves: fetch + verify + load as the member logged it, {_spread(boot)} s of "
            f"{median_join:.1f} s (median); the rest is starting `serve`, joining the group, catching up and "
            "/readyz noticing it.",
        ]
        s.tables.append("\n".join(lines))
    big = max(results, key=lambda r: r.turns)
    ratios = big.ratios()
    s.targets.append(
        Target(
            f"at {human_count(big.turns)}: time to live from a peer's snapshot <= {TARGET}x from offset 0",
            statistics.median(ratios),
            TARGET,
            higher_is_better=False,
            text=against_noise(ratios, TARGET, higher_is_better=False),
        )
    )
    s.notes = [
        f"Topic: {args.partitions} partitions, turns of the bench's `Workload` ({args.projects} projects x 4 "
        f"sources, {args.body_bytes}-byte bodies), filled by two producer processes (not timed as a result).",
        "A join is timed from just before member B's `serve --group` process starts (empty `--db`) until its "
        "`/readyz` `group` names both members in one generation, `held` is not empty, `catchingUp` is empty and "
        "`heldLag` is 0: B is live on every partition it holds and answers their reads itself (polled every "
        f"{POLL_S:g} s). Copies 2 (the default): B is given every partition.",
        "From a peer's snapshot: peer bootstrap on (the default); from offset 0: "
        "`THROUGHLINE_GROUP_PEER_BOOTSTRAP=off` (the member never asks a peer; checked in its log). The two "
        "joins of a pair run back to back, their order alternating pair by pair; the ratio is the pair's.",
        f"Machine: {os.cpu_count()} cores shared with other sessions' test runs; the broker, A and B run on them.",
    ]
    return s


def render(s: Section, command: str) -> str:
    """The section as markdown."""
    out = [f"## {s.title}", "", f"Reproduce: `{command}`", ""]
    for table in s.tables:
        out += [table, ""]
    for t in s.targets:
        out.append(f"- Target {t.name}: {t.value:.3f} ({t.text}): **{'PASS' if t.passed else 'MISS'}**")
    out.append("")
    out += [f"- {note}" for note in s.notes]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------ command


def _counts(text: str) -> list[int]:
    return [parse_count(t) for t in text.split(",") if t.strip()]


def _until(text: str) -> float:
    """``HH:MM`` (UTC, today) as a Unix time."""
    hour, minute = (int(x) for x in text.split(":"))
    now = dt.datetime.now(dt.UTC)
    return now.replace(hour=hour, minute=minute, second=0, microsecond=0).timestamp()


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line (see the module)."""
    p = argparse.ArgumentParser(
        prog="python -m bench member-join", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a smoke run: 3k turns, one pair, 3 partitions")
    p.add_argument("--sizes", type=_counts, help="turns of each size's topic (default 1M,10M)")
    p.add_argument("--repeat", type=_counts, help="pairs per size, one value or one per size (default 3)")
    p.add_argument("--until", type=_until, help="HH:MM UTC: start no pair that would end past it (bar a size's first)")
    p.add_argument("--partitions", type=int, help="partitions of the topic (default 6)")
    p.add_argument("--body-bytes", type=int, default=64, help="body size of a turn (default 64)")
    p.add_argument("--projects", type=int, default=240, help="projects of the workload (default 240)")
    p.add_argument("--no-breakdown", action="store_true", help="skip the step-by-step pass of the snapshot path")
    p.add_argument("--logs", type=Path, help="keep each joining member's log in this folder (its timeline)")
    p.add_argument("--workdir", type=Path, default=REPO / ".cache" / "bench", help="scratch folder (removed after)")
    a = p.parse_args(argv)
    a.sizes = a.sizes or ([3_000] if a.quick else [1_000_000, 10_000_000])
    a.repeat = a.repeat or [1 if a.quick else 3]
    if len(a.repeat) not in (1, len(a.sizes)) or min(a.repeat) < 1:
        p.error("--repeat: one count of at least 1, or one per size")
    a.partitions = a.partitions or (3 if a.quick else 6)
    return a


@contextlib.contextmanager
def _workdir(path: Path) -> Iterator[None]:
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.rmdir()  # only when empty: another run's files there are not this run's to remove


def main(argv: Sequence[str]) -> int:
    """``python -m bench member-join``: measure every size, print the section; 0 unless a join failed."""
    args = parse_args(argv)
    repeats = args.repeat * len(args.sizes) if len(args.repeat) == 1 else args.repeat
    results: list[SizeResult] = []
    started = dt.datetime.now(dt.UTC)
    with _workdir(args.workdir), broker() as bootstrap:
        for turns, repeat in zip(args.sizes, repeats, strict=True):
            log(f"--- {human_count(turns)} turns, {repeat} pair(s) (load {loadavg():.1f})")
            results.append(measure_size(bootstrap, turns, repeat, args, args.until))
    command = ".venv/bin/python -m bench member-join" + "".join(f" {x}" for x in argv)
    text = render(section(results, args), command)
    sys.stdout.write(f"{text}\n- Run {started:%Y-%m-%d %H:%M}-{dt.datetime.now(dt.UTC):%H:%M} UTC.\n")
    return 0
