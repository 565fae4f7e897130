"""Profiles for missed targets: py-spy sampling this very process and its children (every thread, so
the projector's fetch worker too), summarised as the frames that held the most samples (self and
inclusive). py-spy runs from its own pinned environment (``bench.peers``), built on first use."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench import peers
from bench.common import REPO, log

_PLUMBING = re.compile(r"\((threading\.py|bench/[^)]*|<stdin>|<string>|<frozen runpy>)\)$|^<module> ")
# Leaf frames where a thread waits rather than works (py-spy's idle detection misses some of them).
_IDLE = re.compile(
    r"^(Condition\.wait|Event\.wait|EpollSelector\.select|DefaultSelector\.select|select|poll|sleep|"
    r"Queue\.get|SimpleQueue\.get|SemLock\.__enter__|_wait_for_tstate_lock|Thread\.join|accept|recv_into) "
)
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


@dataclass
class Profile:
    """A summary of one py-spy recording."""

    label: str
    samples: int = 0
    self_top: list[tuple[str, float]] = field(default_factory=list)  # (frame, share of samples)
    inclusive_top: list[tuple[str, float]] = field(default_factory=list)
    threads: list[tuple[str, float]] = field(default_factory=list)
    raw_path: Path | None = None
    idle: int = 0  # samples whose leaf frame was a wait (left out of every share)
    error: str | None = None
    missing: str | None = None  # the processes of a recording whose py-spy recorded nothing, and why
    sampler: str = "py-spy at 200 Hz"  # what took the samples (``bench.jfr``: the JVM's flight recorder)

    @classmethod
    def from_counts(
        cls,
        label: str,
        working: int,
        self_counts: Counter[str],
        inclusive_counts: Counter[str],
        thread_counts: Counter[str],
        raw_path: Path | None,
        *,
        idle: int,
        sampler: str | None = None,
    ) -> Profile:
        """A profile of ``working`` samples from per-frame and per-thread sample counts (the top 20 frames
        each way, every thread, as shares of ``working``)."""
        extra = {} if sampler is None else {"sampler": sampler}
        return cls(
            label,
            working,
            [(f, c / working) for f, c in self_counts.most_common(20)],
            [(f, c / working) for f, c in inclusive_counts.most_common(20)],
            [(t, c / working) for t, c in thread_counts.most_common()],
            raw_path,
            idle=idle,
            **extra,
        )

    def _incomplete(self) -> str:
        return f"; incomplete, py-spy failed for {self.missing}" if self.missing else ""

    def markdown(self, top: int = 12) -> str:
        """The profile as a markdown block."""
        if self.error:
            return f"**{self.label}**: no profile ({self.error})."
        lines = [
            f"**{self.label}** ({self.samples:,} working samples over all threads, {self.sampler}; "
            f"{self.idle:,} samples waiting in a lock, queue, select or sleep left out{self._incomplete()})",
            "",
        ]
        if self.threads:
            lines.append("Threads: " + ", ".join(f"{t} {s:.0%}" for t, s in self.threads[:6]))
            lines.append("")
        lines += [
            "| self (on-CPU in this frame) | share | inclusive (this frame and below) | share |",
            "|---|---|---|---|",
        ]
        for i in range(min(top, max(len(self.self_top), len(self.inclusive_top)))):
            a = self.self_top[i] if i < len(self.self_top) else ("", 0.0)
            b = self.inclusive_top[i] if i < len(self.inclusive_top) else ("", 0.0)
            lines.append(f"| `{a[0]}` | {a[1]:.0%} | `{b[0]}` | {b[1]:.0%} |")
        return "\n".join(lines)

    def bottleneck(self, top: int = 4) -> str:
        """A one-line summary: the frames holding the most samples, and how the threads shared them."""
        if self.error:
            return f"no profile ({self.error})"
        frames = ", ".join(f"`{f}` {s:.0%}" for f, s in self.self_top[:top])
        threads = ", ".join(f"{t} {s:.0%}" for t, s in self.threads[:3])
        return f"{self.sampler.split(' at ')[0]}, on-CPU self time: {frames} (threads: {threads}{self._incomplete()})"


def _short(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m.group("file")
    for marker in ("site-packages/", "/work/main/", str(REPO) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{m.group('func')} ({path})"


def summarise(raw: Path, label: str) -> Profile:
    """Aggregate py-spy's collapsed stacks (``--format raw``) into top self and inclusive frames."""
    selfc: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = working = idle = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        lead: list[str] = []
        while frames and frames[0].startswith(("thread", "process")):
            lead.append(frames.pop(0))
        if not frames:
            continue
        # With --subprocesses a child's stacks start with its parent's and its own process frame: the
        # projector's fetch worker is named so, its threads apart from the main process's.
        processes = [f for f in lead if f.startswith("process")]
        thread = next((f for f in reversed(lead) if f.startswith("thread")), "")
        name = thread.split(": ", 1)[1] if ": " in thread else thread
        if len(processes) > 1 and "projector.feed" in processes[-1]:
            name = f"fetch worker {name}".strip()
        total += n
        short = [_short(f) for f in frames]
        if _IDLE.match(short[-1]):
            idle += n
            continue
        selfc[short[-1]] += n
        working += n
        if name:
            threads[name] += n
        for f in set(short):
            if not _PLUMBING.search(f):
                incl[f] += n
    if working == 0:
        return Profile(label, error="py-spy recorded no working samples")
    return Profile.from_counts(label, working, selfc, incl, threads, raw, idle=idle)


def _children(pid: int) -> list[tuple[int, str]]:
    """The processes whose parent is ``pid`` (its threads' ``/proc`` children lists), with their command
    lines (``pid_cmdline``; a child gone meanwhile is left out)."""
    # Here, not at the top: the rig's producer processes import this module and never profile.
    from throughline.testing.kafka.jvm import pid_cmdline

    out: list[tuple[int, str]] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue  # the thread ended meanwhile
        for child in map(int, children):
            cmdline = " ".join(pid_cmdline(child))
            if cmdline:
                out.append((child, cmdline))
    return out


def _merge_raw(parts: list[tuple[Path, str]], out: Path) -> None:
    """One raw file of several recordings, each stack led by its ``process`` frames (``summarise``
    names a child's threads by them)."""
    lines: list[str] = []
    for raw, lead in parts:
        if raw.exists():
            lines += [lead + line for line in raw.read_text(errors="replace").splitlines() if line.strip()]
    out.write_text("\n".join(lines) + ("\n" if lines else ""))


@contextlib.contextmanager
def recording(label: str, out: Path, pid: int | None = None) -> Iterator[list[Profile]]:
    """Record a process (this one by default) with py-spy, every thread, while the block runs.

    This process is recorded with ``--subprocesses`` (the projector's fetch worker starts inside the
    block). Another process (``pid``: ``serve``) and each of its children at the start get a py-spy of
    their own: in full runs py-spy on ``serve`` died of a segmentation fault (exit status -11) in most
    sweeps, with ``--subprocesses`` taking the fetch worker's samples down with it; apart, what the
    others recorded is kept, and the profile names the process it lacks (``Profile.missing``). Yields
    a list that holds the ``Profile`` once the block has finished.
    """
    holder: list[Profile] = []
    try:
        peers.PY_SPY.ensure()
    except (peers.PeerEnvError, OSError, subprocess.SubprocessError) as exc:
        holder.append(Profile(label, error=f"py-spy's environment could not be built: {exc}"))
        yield holder
        return
    py_spy = str(peers.PY_SPY.bin("py-spy"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    # pid, what it is, raw file, lead frames, extra flags
    targets: list[tuple[int, str, Path, str, list[str]]] = []
    if pid is None:
        targets.append((os.getpid(), "this process", out, "", ["--subprocesses"]))
    else:
        targets.append((pid, "serve", out.with_suffix(".0"), "", []))
        for i, (child, cmdline) in enumerate(_children(pid), 1):
            lead = f'process {pid}:"serve";process {child}:"{cmdline}";'
            name = "the fetch worker" if "projector.feed" in cmdline else f"child {child}"
            targets.append((child, name, out.with_suffix(f".{i}"), lead, []))
    procs = []
    for target, _, raw, _, extra in targets:
        raw.unlink(missing_ok=True)
        procs.append(
            subprocess.Popen(
                [
                    py_spy,
                    "record",
                    "--pid",
                    str(target),
                    "--rate",
                    "200",
                    "--format",
                    "raw",
                    "--threads",
                    *extra,
                    "--nonblocking",
                    "-o",
                    str(raw),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        )
    time.sleep(1.0)  # let py-spy attach before the work starts
    try:
        yield holder
    finally:
        errors: list[str] = []  # "<process>: <why>" of each py-spy that failed
        for proc in procs:
            proc.send_signal(signal.SIGINT)
        for proc, (_, name, _, _, _) in zip(procs, targets, strict=True):
            try:
                _, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate(timeout=10)
            if proc.returncode not in (0, None):
                message = (err or b"").decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
                errors.append(f"{name}: {message[0]} (exit status {proc.returncode})")
        if pid is not None:
            _merge_raw([(raw, lead) for _, _, raw, lead, _ in targets], out)
            for _, _, raw, _, _ in targets:
                raw.unlink(missing_ok=True)
        if out.exists() and out.stat().st_size:
            profile = summarise(out, label)
            if errors:
                profile.missing = "; ".join(errors)
                log(f"py-spy failed for part of {label}: {errors}")
            holder.append(profile)
        else:
            # The exit status tells a py-spy that died (a signal, a failed attach) from one that ran and
            # wrote nothing.
            holder.append(Profile(label, error=f"py-spy: {'; '.join(errors) if errors else 'no output'}"))
            log(f"py-spy failed for {label}: {errors or 'no output'}, output {out}")
