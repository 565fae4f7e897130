"""Profiles of the Kafka Streams peer: the JDK Flight Recorder, started and stopped around one freshness
cell with ``jcmd PID JFR.start|JFR.stop`` (the JVM's attach API; the peer needs no flag), summarised
from ``jfr print`` as ``bench.profile.Profile``s, so they read like py-spy's profiles of ``serve``.

The recording uses the JDK's ``profile`` settings: a thread running Java code is sampled every 10 ms
(``jdk.ExecutionSample``), a thread inside a native method every 20 ms (``jdk.NativeMethodSample``;
RocksDB's JNI calls, socket reads, epoll). A native sample counts twice (its period is twice as
long); one whose top frame is a wait (epoll, park, a blocking socket read or accept, sleep) is left
out as idle, as py-spy's idle frames are.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from bench.common import log
from bench.profile import Profile

SAMPLER = "JDK Flight Recorder, `profile` settings (Java code every 10 ms a thread, native code every 20 ms)"
_WAIT = re.compile(
    r"(EPoll\.wait|epollWait|Unsafe\.park|Object\.wait|Thread\.sleep|Net\.accept|Net\.poll|"
    r"SocketDispatcher\.read0|NioSocketImpl\.read|ServerSocketChannelImpl\.accept|FileDispatcherImpl\.read0|"
    r"Thread\.yield|Selector.*\.select|KQueue|poll0|FileInputStream\.readBytes)"
)
_FRAME = re.compile(r"^\s*(?P<where>[\w$.<>/]+)\((?P<args>[^)]*)\)")
_TIMEOUT_S = 60


def _jcmd(pid: int, *args: str) -> str | None:
    """Run ``jcmd PID ARGS``; ``None`` when it worked, else why not."""
    try:
        proc = subprocess.run(
            ["jcmd", str(pid), *args], capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"jcmd {args[0]}: {exc}"
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0 or "Exception" in text or "Could not" in text:
        return f"jcmd {args[0]}: {text.splitlines()[-1] if text else f'exit status {proc.returncode}'}"
    return None


def _short(frame: str) -> str:
    """``pkg.Class.method(args) line: N`` as ``Class.method``."""
    m = _FRAME.match(frame)
    where = m.group("where") if m else frame.strip()
    parts = where.split(".")
    return ".".join(parts[-2:]) if len(parts) >= 2 else where


def _thread(name: str) -> str:
    """A thread's name without the application id or the client ids the peer makes up per run."""
    name = name.split(" | ", 1)[0]
    m = re.search(r"(StreamThread-\d+|GlobalStreamThread|CleanupThread|StateUpdater-\d+)", name)
    if m:
        return m.group(1)
    name = re.sub(r"-\d+$", "-N", re.sub(r"pool-\d+-thread", "pool-N-thread", name))
    return name


def summarise(recording: Path, label: str) -> Profile:
    """Top frames (self and inclusive) and threads of a recording's samples."""
    proc = subprocess.run(
        [
            "jfr",
            "print",
            "--events",
            "jdk.ExecutionSample,jdk.NativeMethodSample",
            "--stack-depth",
            "48",
            str(recording),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        return Profile(label, error=f"jfr print: {proc.stderr.strip()[-300:]}", sampler=SAMPLER)
    return parse(proc.stdout, label, recording)


def parse(text: str, label: str, recording: Path | None = None) -> Profile:
    """The profile of ``jfr print``'s text of execution and native method samples."""
    selfc: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    working = idle = 0
    kind, thread, in_stack = "", "", False
    frames: list[str] = []

    def flush() -> None:
        nonlocal working, idle
        if not frames:
            return
        weight = 2 if kind == "jdk.NativeMethodSample" else 1
        if kind == "jdk.NativeMethodSample" and _WAIT.search(frames[0]):
            idle += weight
            return
        short = [_short(f) for f in frames]
        selfc[short[0]] += weight
        for f in set(short):
            incl[f] += weight
        threads[_thread(thread)] += weight
        working += weight

    for line in text.splitlines():
        s = line.strip()
        if s.endswith("{") and s.startswith("jdk."):
            kind, thread, frames, in_stack = s.split()[0], "", [], False
        elif s.startswith("sampledThread = "):
            thread = s.split('"')[1] if '"' in s else s
        elif s.startswith("stackTrace = ["):
            in_stack = True
        elif in_stack and s == "]":
            in_stack = False
        elif in_stack and s and s != "...":
            frames.append(s)
        elif s == "}":
            flush()
            frames = []
    if working == 0:
        return Profile(label, error="the flight recorder took no working samples", sampler=SAMPLER)
    return Profile.from_counts(label, working, selfc, incl, threads, recording, idle=idle, sampler=SAMPLER)


@contextlib.contextmanager
def recording(label: str, out: Path, pid: int) -> Iterator[list[Profile]]:
    """Record the JVM ``pid`` with the flight recorder while the block runs; the list it yields holds the
    ``Profile`` once the block has finished (one with ``error`` set when the recorder failed)."""
    holder: list[Profile] = []
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    name = f"bench-{os.getpid()}"
    failed = _jcmd(pid, "JFR.start", f"name={name}", "settings=profile", f"filename={out}")
    if failed:
        log(f"no flight recording of {label}: {failed}")
        holder.append(Profile(label, error=failed, sampler=SAMPLER))
        yield holder
        return
    try:
        yield holder
    finally:
        failed = _jcmd(pid, "JFR.stop", f"name={name}")
        if failed or not out.is_file():
            log(f"no flight recording of {label}: {failed or 'no file'}")
            holder.append(Profile(label, error=failed or "the recording wrote no file", sampler=SAMPLER))
        else:
            holder.append(summarise(out, label))
