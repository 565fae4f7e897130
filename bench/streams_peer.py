"""The Kafka Streams peer (``bench/peers/kafka-streams/``): built with Maven into the peer cache, run as a
JVM subprocess, and checked against the projector before anything of it is timed.

The application folds each source's chain into RocksDB state stores (changelogged) by throughline's rules
and serves a project's first page over HTTP from IQv2 queries bounded by a log position
(``PositionBound``; ``NOT_UP_TO_BOUND`` becomes HTTP 409). Its Java source documents the stores.

Build: the peer folder (``pom.xml``, ``src/``) is copied into ``~/.cache/throughline/bench-peers/
kafka-streams-HASH`` (``HASH`` covers the pom, the sources and the JDK's version) and built there with
``mvn package`` (offline, ``-o``, when Maven's local repository already holds kafka-streams; else from
Maven Central); a marker written last says the build finished, a lock keeps two runs from building at
once (``bench.peers``' rules).

Correctness: ``compare_chains`` sets the peer's chains (per source: length and head chain digest, and the
broken mark) beside the projector's from its DuckDB ``sources`` table; ``require_agreement`` raises
``PeerDisagreesError`` on any difference, and the bench times no peer that raised it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import duckdb

from bench import peers
from bench.common import REPO, log

PEER_DIR = REPO / "bench" / "peers" / "kafka-streams"
SCHEMAS_DIR = REPO / "schemas"
KAFKA_STREAMS_VERSION = "4.1.0"
#: The two configurations measured: Kafka Streams' exactly-once (commit.interval.ms defaults to 100
#: under it) and at-least-once (commit.interval.ms defaults to 30,000; the app asks for a commit after
#: the last record it was told to expect, see ``Main.Fold.process``).
GUARANTEES = ("exactly_once_v2", "at_least_once")
_JAR = "target/streams-peer-1.jar"
_MARKER = "bench-peer.json"

#: One source's chain: (length, head chain digest, broken).
Chain = tuple[int, bytes, bool]


class PeerDisagreesError(RuntimeError):
    """The peer's chains differ from the projector's: the bench refuses to time it."""


def _java_version() -> str:
    """``java -version``'s text ('' without a JDK on the PATH: the build then fails with Maven's words)."""
    try:
        proc = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return (proc.stderr or proc.stdout).strip()


def build_dir() -> Path:
    """Where the built peer lives (depends on the pom, the sources and the JDK)."""
    h = hashlib.sha256()
    for path in sorted([PEER_DIR / "pom.xml", *(PEER_DIR / "src").rglob("*.java")]):
        h.update(str(path.relative_to(PEER_DIR)).encode())
        h.update(path.read_bytes())
    h.update(_java_version().encode())
    return peers.root() / f"kafka-streams-{h.hexdigest()[:12]}"


def _in_local_repo() -> bool:
    jar = f"kafka-streams-{KAFKA_STREAMS_VERSION}.jar"
    return (
        Path.home() / ".m2" / "repository" / "org" / "apache" / "kafka" / "kafka-streams" / KAFKA_STREAMS_VERSION / jar
    ).is_file()


def ensure_built() -> Path:
    """Build the peer unless its cached build is complete; return the build folder."""
    target = build_dir()
    if (target / _MARKER).is_file():
        return target
    peers.root().mkdir(parents=True, exist_ok=True)
    with peers._locked(peers.root() / "kafka-streams.lock"):
        if (target / _MARKER).is_file():
            return target
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        shutil.copy2(PEER_DIR / "pom.xml", target / "pom.xml")
        shutil.copytree(PEER_DIR / "src", target / "src")
        log(f"building the Kafka Streams peer (kafka-streams {KAFKA_STREAMS_VERSION}, Maven) in {target}")
        start = time.monotonic()
        offline = ["-o"] if _in_local_repo() else []
        mvn = [
            "mvn",
            "-B",
            "-q",
            "-Dstyle.color=never",
            *offline,
            "-f",
            str(target / "pom.xml"),
            "package",
            "-DskipTests",
        ]
        try:
            peers._run(mvn, "kafka-streams: mvn")
        except peers.PeerEnvError:
            if not offline:
                raise
            peers._run([a for a in mvn if a != "-o"], "kafka-streams: mvn (online)")
        jars = sorted(p.name for p in (target / "target" / "lib").glob("*.jar"))
        doc = {"kafka_streams": KAFKA_STREAMS_VERSION, "jars": jars, "java": _java_version()}
        (target / _MARKER).write_text(json.dumps(doc, indent=1), encoding="utf-8")
        log(f"Kafka Streams peer built in {time.monotonic() - start:.0f} s")
    return target


def command(
    bootstrap: str,
    topic: str,
    state: Path,
    guarantee: str,
    *,
    expect: int = -1,
    dump: Path | None = None,
    port: int | None = None,
    trace: bool = False,
) -> list[str]:
    """The peer's command line (a fresh application id, so every run reads the topic from offset 0;
    ``trace``: it keeps when each record became readable, for ``GET /trace``)."""
    target = ensure_built()
    cp = f"{target / _JAR}:{target / 'target' / 'lib'}/*"
    cmd = [
        "java",
        "-cp",
        cp,
        "throughline.bench.Main",
        f"bootstrap={bootstrap}",
        f"topic={topic}",
        f"app=bench-ks-{uuid.uuid4().hex[:8]}",
        f"state={state}",
        f"guarantee={guarantee}",
        f"schemas={SCHEMAS_DIR}",
        f"expect={expect}",
    ]
    if dump is not None:
        cmd.append(f"dump={dump}")
    if port is not None:
        cmd.append(f"port={port}")
    if trace:
        cmd.append("trace=1")
    return cmd


@dataclass(frozen=True)
class PeerRun:
    """One fold of the topic by the peer: what it reported, and its chains."""

    records: int
    seconds: float
    quarantined: int
    chains: dict[bytes, Chain]
    first_record_s: float  # from the start to the first record folded (joining the group, assignment)

    @property
    def rate(self) -> float:
        """Records per second (start of the app to the last offset committed)."""
        return self.records / self.seconds if self.seconds > 0 else float("nan")

    @property
    def rate_after_start(self) -> float:
        """Records per second from the first record folded to the last offset committed."""
        span = self.seconds - self.first_record_s
        return self.records / span if span > 0 else float("nan")


def run_fold(
    bootstrap: str, topic: str, guarantee: str, expected: int, workdir: Path, timeout_s: float = 1800.0
) -> PeerRun:
    """Fold ``topic`` from offset 0 to its end with a fresh state dir; return the run and its chains."""
    state = workdir / "ks-state"
    dump = workdir / "ks-chains.txt"
    shutil.rmtree(state, ignore_errors=True)
    dump.unlink(missing_ok=True)
    cmd = command(bootstrap, topic, state, guarantee, expect=expected, dump=dump)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False, stdin=subprocess.DEVNULL)
    shutil.rmtree(state, ignore_errors=True)
    done = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{") and '"done"' in line]
    if proc.returncode != 0 or not done:
        raise RuntimeError(f"Kafka Streams peer exited {proc.returncode}: {(proc.stdout + proc.stderr)[-2000:]}")
    doc = done[-1]
    chains = parse_dump(dump.read_text(encoding="utf-8"))
    dump.unlink(missing_ok=True)
    if int(doc["records"]) != expected:
        raise RuntimeError(f"Kafka Streams peer folded {doc['records']} of {expected} records")
    return PeerRun(
        int(doc["records"]),
        float(doc["seconds"]),
        int(doc["quarantined"]),
        chains,
        float(doc["first_record_s"]),
    )


def parse_dump(text: str) -> dict[bytes, Chain]:
    """The peer's chain dump: one ``SOURCE_HEX LENGTH DIGEST_HEX BROKEN`` line per source."""
    out: dict[bytes, Chain] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        source, length, digest, broken = line.split()
        out[bytes.fromhex(source)] = (int(length), bytes.fromhex(digest), broken == "1")
    return out


def projector_chains(db: Path) -> dict[bytes, Chain]:
    """The projector's chains from its DuckDB file, as its reader sees them: each ``sources`` row (length,
    chain digest, broken mark as of the source's last milestone) moved on to the live head past it
    (``heads_past_milestones``, the reader's own lookup)."""
    from projector.store.view import heads_past_milestones

    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute(
            "SELECT source_sha256, length, chain_digest, broken_reason IS NOT NULL FROM sources"
        ).fetchall()
        chains = {bytes(s): (int(n), bytes(d), bool(b)) for s, n, d, b in rows}
        past = heads_past_milestones(con.cursor(), {s: c[0] for s, c in chains.items()})
    finally:
        con.close()
    for source, (length, digest, _partition, _offset) in past.items():
        chains[source] = (length, digest, chains[source][2])
    return chains


def compare_chains(reference: dict[bytes, Chain], peer: dict[bytes, Chain]) -> list[str]:
    """Every difference between two sets of chains (empty when they agree), the first few spelled out."""
    diffs: list[str] = []
    for source in sorted(reference.keys() | peer.keys()):
        want, got = reference.get(source), peer.get(source)
        if want == got:
            continue
        if want is None:
            diffs.append(f"source {source.hex()[:12]}: only the peer has it")
        elif got is None:
            diffs.append(f"source {source.hex()[:12]}: the peer does not have it")
        else:
            what = []
            if want[0] != got[0]:
                what.append(f"length {got[0]} != {want[0]}")
            if want[1] != got[1]:
                what.append("head chain digest differs")
            if want[2] != got[2]:
                what.append(f"broken {got[2]} != {want[2]}")
            diffs.append(f"source {source.hex()[:12]}: " + ", ".join(what))
    return diffs


def require_agreement(reference: dict[bytes, Chain], peer: dict[bytes, Chain], label: str) -> None:
    """Raise ``PeerDisagreesError`` unless the peer reached exactly the projector's chains."""
    if not reference:
        raise PeerDisagreesError(f"{label}: the projector has no chains to compare with")
    diffs = compare_chains(reference, peer)
    if diffs:
        shown = "; ".join(diffs[:5]) + (f"; and {len(diffs) - 5} more" if len(diffs) > 5 else "")
        raise PeerDisagreesError(
            f"{label} disagrees with the projector on {len(diffs)} of {len(reference)} sources: {shown}"
        )
