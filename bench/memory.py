"""Item 6: the projector's peak RSS against topic size.

One topic grows through the sizes (each step appends the next slice of the same workload); at each size
``throughline project --until-caught-up`` runs as a subprocess into a new file, and its peak RSS is the
kernel's high-water mark ``VmHWM`` read from ``/proc/PID/status`` every 50 ms while it runs (the mark
only rises, so the last reading is the peak), plus that of its fetch worker process. ``ru_maxrss``
from ``wait4`` is not used: Linux carries the parent's RSS at ``fork`` into the child's ``ru_maxrss``
across ``exec``, so it reports the benchmark's own size for any small child.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

from bench.common import (
    PYTHON,
    Config,
    Encoded,
    Figure,
    Section,
    Target,
    Workload,
    bare_producer,
    create_topic,
    delete_topics,
    encode_workload,
    end_offsets,
    human_count,
    log,
    new_topic_name,
)

#: "Flat": the peak at the largest topic at most this many times the peak at the smallest.
FLAT_FACTOR = 1.5


def project_command(bootstrap: str, topic: str, db: Path) -> list[str]:
    """The projector's command line."""
    return [
        PYTHON,
        "-m",
        "throughline.cli",
        "project",
        "--until-caught-up",
        "--bootstrap-servers",
        bootstrap,
        "--topic",
        topic,
        "--db",
        str(db),
    ]


def _vm_hwm_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def peak_rss(cmd: list[str], timeout_s: float = 1800.0) -> tuple[float, float]:
    """Run ``cmd``; return (peak RSS MiB, wall seconds).

    The peak is the projector's own last VmHWM reading plus that of each child it started (its fetch
    worker), summed: an upper bound of what the two held at once.
    """
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peaks: dict[int, int] = {}
    done = threading.Event()

    def sample() -> None:
        # The child stays a zombie until wait4 reaps it below, so /proc/PID is never another process.
        while not done.is_set():
            for pid in (proc.pid, *_children(proc.pid)):
                peaks[pid] = max(peaks.get(pid, 0), _vm_hwm_kib(pid))
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    deadline = time.monotonic() + timeout_s
    status = 0
    while True:
        pid, status, _usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
            os.wait4(proc.pid, 0)
            raise TimeoutError(f"{cmd[3:5]} did not finish in {timeout_s}s")
        time.sleep(0.05)
    done.set()
    sampler.join(timeout=5)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"projector exited {proc.returncode}: {err[-2000:]}")
    return sum(peaks.values()) / 1024, time.perf_counter() - start


def _append(bootstrap: str, topic: str, data: Encoded, lo: int, hi: int) -> None:
    producer = bare_producer(bootstrap)
    try:
        for i in range(lo, hi):
            producer.send(topic, value=data.values[i], key=data.keys[i], partition=data.partitions[i])
        producer.flush(timeout=600)
    finally:
        producer.close(timeout=30)


def measure(cfg: Config, bootstrap: str, workdir: Path) -> Section:
    """Peak RSS of the projector process at each of ``cfg.memory_sizes`` (medians of ``cfg.repeat`` runs)."""
    sizes = sorted(cfg.memory_sizes)
    wl = Workload(sizes[-1], body_bytes=cfg.memory_body_bytes, projects=cfg.projects, threads=cfg.threads, label="mem")
    data = encode_workload(wl, cfg.partitions)
    topic = new_topic_name("memory")
    create_topic(bootstrap, topic, cfg.partitions)
    rss: dict[int, list[float]] = {}
    secs: dict[int, list[float]] = {}
    db_mib: dict[int, float] = {}
    have = 0
    for size in sizes:
        _append(bootstrap, topic, data, have, size)
        have = size
        if sum(end_offsets(bootstrap, topic).values()) != size:
            raise RuntimeError(f"memory topic does not hold {size} records")
        for rep in range(cfg.repeat):
            db = workdir / f"memory-{human_count(size)}.duckdb"
            for p in (db, Path(str(db) + ".wal")):
                p.unlink(missing_ok=True)
            peak, seconds = peak_rss(project_command(bootstrap, topic, db))
            rss.setdefault(size, []).append(peak)
            secs.setdefault(size, []).append(seconds)
            db_mib[size] = db.stat().st_size / 2**20
            log(f"memory {human_count(size)} rep {rep + 1}: peak RSS {peak:,.0f} MiB, {seconds:.1f} s")
            for p in (db, Path(str(db) + ".wal")):
                p.unlink(missing_ok=True)
    delete_topics(bootstrap, [topic])
    sec = Section("memory", "6. Projector memory against topic size")
    rows = [
        "| topic size | Avro MiB | projection file MiB | peak RSS MiB (VmHWM) | run s (with start-up) |",
        "|---|---|---|---|---|",
    ]
    for size in sizes:
        f_rss = Figure("", rss[size], "MiB", "{:,.0f}")
        f_s = Figure("", secs[size], "s", "{:.1f}")
        avro = sum(len(v) for v in data.values[:size]) / 2**20
        rows.append(f"| {size:,} | {avro:,.0f} | {db_mib[size]:,.0f} | {f_rss.text()} | {f_s.text()} |")
        sec.figures.append(Figure(f"peak RSS at {human_count(size)} turns", rss[size], "MiB", "{:,.0f}"))
    sec.tables.append("\n".join(rows))
    small = Figure("", rss[sizes[0]], "MiB").median
    large = Figure("", rss[sizes[-1]], "MiB").median
    sec.targets = [
        Target(
            f"peak RSS flat: at {human_count(sizes[-1])} turns <= {FLAT_FACTOR}x the peak at {human_count(sizes[0])}",
            large / small if small else None,
            FLAT_FACTOR,
            higher_is_better=False,
            text="ratio of peaks",
        )
    ]
    sec.notes = [
        f"`{' '.join(project_command('B', 'T', Path('F'))[1:])}` (B, T, F: the broker, a topic, a new file) "
        f"as a child process; turns of ~{cfg.memory_body_bytes} body bytes; {cfg.partitions} partitions. "
        "The peak is the projector's plus its fetch worker's (each one's VmHWM, summed).",
        f"'Flat' is read as: peak RSS grows by at most {FLAT_FACTOR}x while the topic grows "
        f"{sizes[-1] / sizes[0]:.0f}x.",
    ]
    return sec
