"""Item 7: the producer's compression codec, on turn bodies shaped like real transcripts.

For each codec (none, gzip, snappy, lz4, zstd), ``TurnProducer.send_many`` appends the same turns to a
fresh topic, with two more variants beside them: ``zstd-128k``, zstd as ``TurnProducer`` compressed before
its compressed batches grew (128 KiB of records a batch, ``COMPRESSED_BATCH_FACTOR`` 1), and ``none-3x``,
uncompressed in batches as large as a compressed batch's (what the larger batches alone are worth); the
item reports the bytes the broker keeps per turn (the partitions' log sizes from
DescribeLogDirs: every segment, indexes excluded) and the producer's throughput, each as a ratio of the
uncompressed run beside it (each codec's run is paired with one, the order alternating), so load that
drifts on the shared machine cancels out of the ratios; the producing process's CPU time is reported
too, as it depends less on that load than the wall clock does. Targets: the chosen codec
(``TurnProducer``'s ``COMPRESSION``) keeps <= 0.4x the uncompressed bytes at >= 0.8x the uncompressed
throughput.

The bodies (``transcript_body``) mix what agent transcripts hold: prose paragraphs, fenced code, shell
commands with their output, test runs, diffs, JSON tool results and file paths, drawn from
vocabularies, prose of free word order, and identifiers that never repeat (commit hashes, digests,
timestamps, line numbers); sizes are log-normal, median ~1.3 KiB, mean ~2 KiB, at most 24 KiB. They are
generated text, not random bytes.

Standalone: ``.venv/bin/python -m bench compression [--turns N] [--repeat N]`` prints the section as
markdown (``THROUGHLINE_TEST_BOOTSTRAP_SERVERS`` or a broker started here).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from bench.common import (
    BASE_MICROS,
    Config,
    Figure,
    Section,
    Target,
    against_noise,
    broker,
    delete_topics,
    end_offsets,
    log,
    new_topic_name,
)
from throughline.core.turn import TurnRecord, build_turn
from throughline.producers import producer as producer_module
from throughline.producers.producer import TurnProducer

#: The variants beside the codecs: label -> (codec, what the row is).
VARIANTS = {
    "zstd-128k": ("zstd", "before: zstd in 128 KiB batches of records"),
    "none-3x": ("none", "reference: 3x larger batches alone"),
}
CODECS = ("none", "gzip", "snappy", "lz4", "zstd", *VARIANTS)
PARTITIONS = 3
DEFAULT_TURNS = 40_000

_PROSE = (
    "I read the failing test first; it expects the cursor to move past the marker, and it does not.",
    "The projector applies each poll in one transaction, so a crash between the rows and the offsets is impossible.",
    "Let me check whether the partition count changed since the topic was created.",
    "That explains the flaky run: the fixture shares the broker, and another test deleted the topic.",
    "I will keep the old behaviour behind the flag until the migration has run everywhere.",
    "The reader answers projection_pending when the applied offset is below the end offset after the wait.",
    "Here is the plan: reproduce the bug, write the smallest test that shows it, fix it, then run the suite.",
    "This is safe because the key is the project hash, so every turn of a project lands on one partition.",
    "The benchmark numbers moved by less than the noise between repetitions, so I would not read much into it.",
    "Done. The change is small: one guard in the fetch loop and a test that fails without it.",
)
_NAMES = ("offset", "cursor", "batch", "record", "turn", "chain", "digest", "partition", "reader", "page")
_FILES = (
    "throughline/log/fetch.py",
    "projector/runner.py",
    "reader/page.py",
    "schemas/codec.py",
    "tests/unit/test_chain.py",
    "producers/producer.py",
    "docs/kafka.md",
    "bench/common.py",
)
_COMMANDS = (
    "pytest -q {f}",
    "git diff --stat",
    "ruff check {f}",
    "grep -n {n} {f}",
    "python -m throughline status",
    "ls -la {d}",
    "git log --oneline -5",
    "mypy {f}",
)


_VOCABULARY = (
    "a about after again all also always an and any are as at be because been before being between both "
    "but by can change check could data did do does done each either error even every expected fails file "
    "first fix for found from function had has have here how however if in instead into is it its just "
    "keep last later least less like line look make many may means method might more most much must need "
    "never new next no not now of old on once one only or other our out over past path perhaps point "
    "problem rather read really reason result right run same second see seems should shows since so some "
    "still such sure test than that the their them then there these they thing this those though three "
    "through time to too two under until up use used value very wait want was way we well were what when "
    "where whether which while who why will with without work would write wrong yet you"
).split()


def _sentences(rng: random.Random) -> str:
    """Prose of free word order (less repetitive than the stock sentences, as real prose is)."""
    words = [rng.choice(_VOCABULARY) for _ in range(rng.randrange(12, 60))]
    if rng.random() < 0.4:
        words.insert(rng.randrange(len(words)), f"`{rng.choice(_NAMES)}_{rng.randrange(1000)}`")
    return " ".join(words).capitalize() + "."


def _ids(rng: random.Random) -> str:
    """Lines full of identifiers that do not repeat: commit hashes, digests, timestamps."""
    lines = []
    for _ in range(rng.randrange(2, 8)):
        lines.append(
            f"{rng.getrandbits(28):07x} 2026-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}T"
            f"{rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d}Z "
            f"{rng.choice(_NAMES)} {rng.getrandbits(128):032x}"
        )
    return "\n".join(lines)


def _code(rng: random.Random) -> str:
    a, b = rng.sample(_NAMES, 2)
    n = rng.randrange(2, 64)
    return (
        f"```python\ndef next_{a}(self, {b}: int) -> int:\n"
        f'    """The {a} after {b} (at most {n} ahead)."""\n'
        f'    if {b} < 0:\n        raise ValueError(f"negative {b}: {{{b}}}")\n'
        f"    return min(self._{a}s.get({b}, {b}) + 1, {b} + {n})\n```"
    )


def _tool(rng: random.Random) -> str:
    f, n = rng.choice(_FILES), rng.choice(_NAMES)
    cmd = rng.choice(_COMMANDS).format(f=f, n=n, d=f.rsplit("/", 1)[0])
    kind = rng.randrange(4)
    if kind == 0:
        passed = rng.randrange(5, 400)
        dots = "." * min(passed, 70)
        return f"$ {cmd}\n{dots} [100%]\n{passed} passed in {rng.uniform(0.1, 40):.2f}s"
    if kind == 1:
        line = rng.randrange(10, 900)
        return (
            f"$ {cmd}\n{f}:{line}:        {n} = self._{n}s[{rng.randrange(99)}]\n"
            f"{f}:{line + rng.randrange(1, 40)}:    def {n}_of(self, key: bytes) -> int:"
        )
    if kind == 2:
        line = rng.randrange(10, 900)
        return (
            f"--- a/{f}\n+++ b/{f}\n@@ -{line},6 +{line},7 @@\n-        if {n} is None:\n"
            f"+        if {n} is None or {n} < 0:\n             return None\n+        self._{n}s.clear()"
        )
    return (
        '{"tool": "read_file", "path": "'
        + f
        + '", "lines": ['
        + str(rng.randrange(1, 300))
        + ", "
        + str(rng.randrange(300, 900))
        + '], "ok": true, "bytes": '
        + str(rng.randrange(100, 90_000))
        + "}"
    )


def transcript_body(rng: random.Random) -> str:
    """One turn body: prose, code and tool lines in a transcript's proportions (median ~1.3 KiB)."""
    target = min(24_000, max(120, int(rng.lognormvariate(7.2, 0.8))))
    parts: list[str] = []
    size = 0
    while size < target:
        roll = rng.random()
        if roll < 0.2:
            piece = " ".join(rng.choice(_PROSE) for _ in range(rng.randrange(1, 4)))
        elif roll < 0.45:
            piece = " ".join(_sentences(rng) for _ in range(rng.randrange(1, 4)))
        elif roll < 0.65:
            piece = _code(rng)
        elif roll < 0.75:
            piece = _ids(rng)
        else:
            piece = _tool(rng)
        parts.append(piece)
        size += len(piece) + 2
    return "\n\n".join(parts)


def transcript_turns(count: int, *, projects: int = 32, seed: int = 11) -> list[TurnRecord]:
    """``count`` turns of ``projects`` projects (one thread each) with ``transcript_body`` bodies."""
    rng = random.Random(seed)
    return [
        build_turn(
            project=f"/bench/compression/project-{i % projects:03d}",
            host="host-0",
            thread="thread-0",
            turn_id=f"turn-{i:010d}",
            completed_at_micros=BASE_MICROS + i * 1000,
            body=transcript_body(rng),
            producer_name="bench",
            producer_version="1",
            produced_at_micros=BASE_MICROS + i * 1000,
        )
        for i in range(count)
    ]


@contextlib.contextmanager
def _codec(codec: str) -> Iterator[None]:
    """``TurnProducer`` built inside uses ``codec`` (its module constants, read by the constructor):
    ``zstd-128k`` is zstd in uncompressed-sized batches, ``none-3x``
    uncompressed in compressed-sized batches."""
    module = producer_module
    saved = (module.COMPRESSION, module.BATCH_BYTES, module.COMPRESSED_BATCH_FACTOR)
    plain = VARIANTS.get(codec, (codec, ""))[0]
    module.COMPRESSION = None if plain == "none" else plain
    if codec == "zstd-128k":
        module.COMPRESSED_BATCH_FACTOR = 1
    if codec == "none-3x":
        module.BATCH_BYTES = module.batch_bytes("zstd")
    try:
        yield
    finally:
        module.COMPRESSION, module.BATCH_BYTES, module.COMPRESSED_BATCH_FACTOR = saved


def log_bytes(bootstrap: str, topic: str) -> int:
    """The bytes the broker keeps for ``topic``: its partitions' sizes from DescribeLogDirs."""
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    try:
        answers = admin.describe_log_dirs([topic])
    finally:
        admin.close()
    total = 0
    for answer in answers:
        for log_dir in answer["log_dirs"]:
            for t in log_dir.get("topics", []):
                if t.get("name") == topic:
                    total += sum(int(p["partition_size"]) for p in t.get("partitions", []))
    return total


@dataclass(frozen=True)
class Run:
    """One ``send_many`` of every turn with one codec."""

    seconds: float  # wall clock
    cpu: float  # CPU seconds of this process (the caller's thread and kafka-python's sender thread)
    log_bytes: int  # what the broker then keeps


def _one(bootstrap: str, codec: str, turns: list[TurnRecord]) -> Run:
    """``TurnProducer.send_many`` of ``turns`` with ``codec`` into a fresh topic."""
    topic = new_topic_name(f"compression-{codec}")
    try:
        with _codec(codec), TurnProducer(bootstrap, topic, partitions=PARTITIONS) as producer:
            start, cpu = time.perf_counter(), time.process_time()
            producer.send_many(turns)
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        if sum(end_offsets(bootstrap, topic).values()) != len(turns):
            raise RuntimeError(f"topic {topic} does not hold {len(turns)} records")
        return Run(seconds, cpu, log_bytes(bootstrap, topic))
    finally:
        delete_topics(bootstrap, [topic])


def measure(cfg: Config, bootstrap: str, turns_count: int | None = None) -> Section:
    """Each codec paired with an uncompressed run right beside it (which goes first alternates),
    ``max(cfg.repeat, cfg.ratio_repeat)`` times (item 1's rule for target ratios); every ratio is a pair's,
    so load that drifts between pairs cancels out."""
    n = turns_count or (2_000 if cfg.quick else DEFAULT_TURNS)
    log(f"compression: generating {n:,} transcript-shaped turns")
    turns = transcript_turns(n)
    body_bytes = sum(len(t.body.encode("utf-8")) for t in turns)
    runs: dict[str, list[Run]] = {c: [] for c in CODECS}
    byte_ratio: dict[str, list[float]] = {c: [] for c in CODECS}
    rate_ratio: dict[str, list[float]] = {c: [] for c in CODECS}
    cpu_ratio: dict[str, list[float]] = {c: [] for c in CODECS}
    _one(bootstrap, "none", turns[: min(n, 5_000)])  # a warm-up (connections, the broker's JIT), not counted
    codecs = CODECS[1:]
    reps = max(cfg.repeat, cfg.ratio_repeat)
    for rep in range(reps):
        for codec in codecs[rep % len(codecs) :] + codecs[: rep % len(codecs)]:
            pair = ("none", codec) if (rep + codecs.index(codec)) % 2 == 0 else (codec, "none")
            got = {c: _one(bootstrap, c, turns) for c in pair}
            base, run = got["none"], got[codec]
            runs["none"].append(base)
            runs[codec].append(run)
            byte_ratio[codec].append(run.log_bytes / base.log_bytes)
            rate_ratio[codec].append(base.seconds / run.seconds)
            cpu_ratio[codec].append(run.cpu / base.cpu)
            log(
                f"compression rep {rep + 1} {codec}: {n / run.seconds:,.0f} turns/s against {n / base.seconds:,.0f}, "
                f"CPU {run.cpu / base.cpu:.2f}x, {run.log_bytes / n:,.0f} bytes/turn"
            )
    for ratios in (byte_ratio, rate_ratio, cpu_ratio):
        ratios["none"] = [1.0] * len(runs["none"])
    chosen = producer_module.COMPRESSION or "none"
    section = Section("compression", "7. Compression: bytes on the broker and producer throughput per codec")
    rows = [
        "| codec | bytes on the broker per turn | x uncompressed | TurnProducer turns/s | x uncompressed "
        "| producer CPU per turn | x uncompressed |",
        "|---|---|---|---|---|---|---|",
    ]
    for codec in CODECS:
        mark = " (TurnProducer's default)" if codec == chosen else ""
        mark = mark or (f" ({VARIANTS[codec][1]})" if codec in VARIANTS else "")
        per_turn = Figure("", [r.log_bytes / n for r in runs[codec]], "B")
        rate = Figure("", [n / r.seconds for r in runs[codec]], "/s")
        cpu = Figure("", [r.cpu / n * 1e6 for r in runs[codec]], "us", "{:.0f}")
        rows.append(
            f"| {codec}{mark} | {per_turn.text()} | {statistics.median(byte_ratio[codec]):.2f} "
            f"| {rate.text()} | {statistics.median(rate_ratio[codec]):.2f} "
            f"| {cpu.text()} us | {statistics.median(cpu_ratio[codec]):.2f} |"
        )
    section.tables.append("\n".join(rows))
    section.figures = [
        Figure(f"{c}: {what} / uncompressed (per pair)", ratios[c], "ratio", "{:.2f}")
        for what, ratios in (
            ("bytes on the broker", byte_ratio),
            ("TurnProducer throughput", rate_ratio),
            ("producer CPU", cpu_ratio),
        )
        for c in codecs
    ]
    section.targets = [
        Target(
            f"{chosen}: bytes on the broker <= 0.4x uncompressed",
            statistics.median(byte_ratio[chosen]),
            0.4,
            higher_is_better=False,
            text=against_noise(byte_ratio[chosen], 0.4, higher_is_better=False),
        ),
        Target(
            f"{chosen}: TurnProducer throughput >= 0.8x uncompressed",
            statistics.median(rate_ratio[chosen]),
            0.8,
            text=against_noise(rate_ratio[chosen], 0.8),
        ),
    ]
    section.notes = [
        f"{n:,} turns, {body_bytes / n:,.0f} body bytes a turn on average (transcript-shaped: prose, code, tool "
        f"output; `bench/compression.py`), {PARTITIONS} partitions; `TurnProducer.send_many` with its settings "
        f"(acks=all, idempotent, linger 5 ms, batches of {producer_module.BATCH_BYTES // 1024} KiB of records "
        f"uncompressed, {producer_module.batch_bytes('zstd') // 1024} KiB compressed) and each codec in turn.",
        "Bytes on the broker: the partitions' log sizes (DescribeLogDirs) after every turn was acknowledged: "
        "record batches with their headers, indexes excluded. Throughput: turns/s of `send_many` (validation, "
        "encoding, compression, every acknowledgement), connecting and creating the topic outside the clock. "
        "Producer CPU: CPU seconds of the producing process over the same span (the caller and kafka-python's "
        "sender thread; not the broker's), less sensitive than the wall clock to the shared machine's load.",
        f"Each codec's run is paired with an uncompressed run right beside it ({reps} pairs a codec, the "
        "order alternating); a ratio is the median of the pairs' ratios, and the uncompressed row's absolute "
        "figures are over all its runs.",
        "kafka-python compresses in the producer's own process, in its sender thread as it drains a batch "
        "(zstandard releases the GIL meanwhile), at kafka-python's own levels (it has no level setting): "
        "gzip at 9, zstd at 3 (zstandard's default; `zstd` and `zstd-128k` alike), lz4 frames, snappy in "
        "xerial framing.",
        f"By CPU (the steadier figure), {chosen}'s producer CPU is {statistics.median(cpu_ratio[chosen]):.2f}x "
        f"the uncompressed (throughput >= 0.8x means CPU <= 1.25x: "
        f"{against_noise(cpu_ratio[chosen], 1.25, higher_is_better=False)}).",
    ]
    return section


def render(section: Section, command: str) -> str:
    """The section as markdown, for the standalone run."""
    out = [f"## {section.title}", "", f"Reproduce: `{command}`", ""]
    out += section.tables
    out.append("")
    for t in section.targets:
        out.append(f"- Target {t.name}: {t.value:.2f} ({t.text}): **{'PASS' if t.passed else 'MISS'}**")
    out.append("")
    out += [f"- {note}" for note in section.notes]
    return "\n".join(out) + "\n"


def main(argv: Sequence[str]) -> int:
    """``python -m bench compression``: run the item alone and print its section."""
    p = argparse.ArgumentParser(
        prog="python -m bench compression",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--turns", type=int, default=DEFAULT_TURNS, help=f"turns per codec run (default {DEFAULT_TURNS:,})")
    p.add_argument("--repeat", type=int, default=15, help="interleaved repetitions (default 15)")
    a = p.parse_args(argv)
    cfg = Config(repeat=max(1, a.repeat), ratio_repeat=max(1, a.repeat))
    with broker() as bootstrap:
        section = measure(cfg, bootstrap, a.turns)
    command = ".venv/bin/python -m bench compression" + "".join(f" {x}" for x in argv)
    sys.stdout.write(render(section, command))
    return 0 if all(t.passed for t in section.targets) else 1
