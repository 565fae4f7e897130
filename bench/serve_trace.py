"""Where a turn's milliseconds go inside ``throughline serve``: timestamps along the projector's path,
joined by log position with the rig's acknowledgements (item 8's profile cells).

A traced ``serve`` runs with ``bench/serve_trace_site`` first on its ``PYTHONPATH`` and
``THROUGHLINE_BENCH_TRACE`` naming a folder: that folder's ``sitecustomize`` calls ``install``, in
``serve`` and in its fetch worker (a child, the same environment), which wraps a few functions as
their modules are imported (nothing else changes; without the variable nothing is installed). Each
process appends lines to ``trace-PID.txt`` in the folder, one ``write`` a line (a poll or a read, not
a record), stamped with ``time.monotonic()`` (``CLOCK_MONOTONIC``, the clock of the rig's
acknowledgement instants and of the JVM's ``System.nanoTime()``):

- ``poll T P LAST N``: the fetch worker's consumer poll returned N records of partition P up to LAST
  (``Fetcher._poll_into``): the broker fetch and kafka-python's parse are behind it;
- ``sent T P NEXT``: the worker prepared (decoded, checked) the poll and pickled it into a frame for
  the main process (``FrameWriter.send``);
- ``got T P NEXT``: the main process has the frame (read off the pipe, unpickled, content checked:
  ``WorkerFeed.next``);
- ``staged T P NEXT``: the poll is folded and staged, readable (``DuckProjection.stage``);
- ``read T TOTAL END WAIT VIEW LONGPOLL``: one read (``ReadApi.answer``), milliseconds in all, in the end
  offset (the broker's ListOffsets, ``KafkaLog.end_offset``), in the wait for the projector
  (``wait_settled``) and in the snapshot's page read (``DuckProjection.read``); ``LONGPOLL`` 1 for a
  long-poll (the rig's follower), which ``load`` leaves out.

``breakdown`` places each followed turn's ack -> readable on those steps.
"""

from __future__ import annotations

import bisect
import importlib.abc
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

# Nothing of bench.common or throughline at the top: ``sitecustomize`` imports this before ``serve`` runs,
# and a throughline module imported here would escape the import hook.
REPO = Path(__file__).resolve().parents[1]
ENV = "THROUGHLINE_BENCH_TRACE"
SITE = REPO / "bench" / "serve_trace_site"

# ------------------------------------------------------------------------------------------ in serve

_out: list[Any] = []  # this process's trace file, opened at the first event
_out_lock = threading.Lock()
_read = threading.local()


def _emit(line: str) -> None:
    with _out_lock:
        if not _out:
            _out.append(open(Path(os.environ[ENV]) / f"trace-{os.getpid()}.txt", "a", buffering=1))
        _out[0].write(line + "\n")


def _wrap(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    setattr(owner, name, make(getattr(owner, name)))


def _batches_line(kind: str, batches: Any) -> None:
    t = time.monotonic()
    for b in batches or ():
        _emit(f"{kind} {t:.6f} {b.partition} {b.next_offset}")


def _patch_poller(m: ModuleType) -> None:
    def make(f: Callable[..., Any]) -> Callable[..., Any]:
        def _poll_into(self: Any, polled: dict[int, list[Any]], timeout: float, max_records: int) -> int:
            before = {p: len(r) for p, r in polled.items()}
            got = int(f(self, polled, timeout, max_records))
            t = time.monotonic()
            for p, records in polled.items():
                n = len(records) - before.get(p, 0)
                if n:
                    _emit(f"poll {t:.6f} {p} {records[-1].offset} {n}")
            return got

        return _poll_into

    _wrap(m.Fetcher, "_poll_into", make)


def _patch_frames(m: ModuleType) -> None:
    def make(f: Callable[..., Any]) -> Callable[..., Any]:
        def send(self: Any, kind: str, payload: Any) -> None:
            f(self, kind, payload)
            if kind == m.BATCHES:
                _batches_line("sent", payload)

        return send

    _wrap(m.FrameWriter, "send", make)


def _patch_worker(m: ModuleType) -> None:
    def make(f: Callable[..., Any]) -> Callable[..., Any]:
        def next_(self: Any, timeout: float) -> Any:
            batches = f(self, timeout)
            _batches_line("got", batches)
            return batches

        return next_

    _wrap(m.WorkerFeed, "next", make)


def _timed(slot: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A wrapper adding the call's milliseconds to slot ``slot`` of the read under way on this thread."""

    def make(f: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            spent = getattr(_read, "spent", None)
            t0 = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                if spent is not None:
                    spent[slot] += (time.perf_counter() - t0) * 1000

        return timed

    return make


def _patch_projection(m: ModuleType) -> None:
    def make(f: Callable[..., Any]) -> Callable[..., Any]:
        def stage(self: Any, topic: str, batches: Any) -> Any:
            layer = f(self, topic, batches)
            _batches_line("staged", batches)
            return layer

        return stage

    _wrap(m.DuckProjection, "stage", make)
    _wrap(m.DuckProjection, "wait_settled", _timed(1))
    _wrap(m.DuckProjection, "read", _timed(2))


def _patch_view(m: ModuleType) -> None:
    _wrap(m.KafkaLog, "end_offset", _timed(0))


def _patch_read_api(m: ModuleType) -> None:
    def make(f: Callable[..., Any]) -> Callable[..., Any]:
        def answer(self: Any, request: Any) -> Any:
            _read.spent = spent = [0.0, 0.0, 0.0]
            t = time.monotonic()
            t0 = time.perf_counter()
            try:
                return f(self, request)
            finally:
                _read.spent = None
                total = (time.perf_counter() - t0) * 1000
                poll = 1 if getattr(request, "wait", 0) else 0  # a long-poll (the follower's): not a first page's
                _emit(f"read {t:.6f} {total:.3f} {spent[0]:.3f} {spent[1]:.3f} {spent[2]:.3f} {poll}")

        return answer

    _wrap(m.ReadApi, "answer", make)


_PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "throughline.projector.feed.poller": _patch_poller,
    "throughline.projector.feed.frames": _patch_frames,
    "throughline.projector.feed.worker": _patch_worker,
    "throughline.projector.store.projection": _patch_projection,
    "throughline.log.view": _patch_view,
    "throughline.serve.read_api": _patch_read_api,
}


class _Patcher(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the finders after it, and patches the module once it has run."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                run = spec.loader.exec_module

                def exec_module(module: ModuleType, run: Any = run, patch: Any = patch) -> None:
                    run(module)
                    patch(module)

                spec.loader.exec_module = exec_module  # type: ignore[method-assign]
                return spec
        return None


def install() -> None:
    """Wrap the traced functions as their modules are imported (``sitecustomize``; ``ENV`` must be set)."""
    if os.environ.get(ENV) and not any(isinstance(f, _Patcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _Patcher())
        for name, patch in _PATCHES.items():
            if name in sys.modules:  # imported before the hook
                patch(sys.modules[name])


def serve_env(folder: Path) -> dict[str, str]:
    """The environment of a traced ``serve``: this one, the trace's ``sitecustomize`` first on the path."""
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env[ENV] = str(folder)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


# ------------------------------------------------------------------------------------------ the breakdown

#: The steps of the projector's path, in order: (event kind, what the step from the one before holds).
STEPS = (
    ("poll", "the broker's append -> the fetch worker's poll returns (the fetch, kafka-python's parse)"),
    ("sent", "-> the poll decoded, checked and pickled into a frame (fetch worker)"),
    ("got", "-> the frame taken by the projector thread (pipe, unpickle, content check)"),
    ("staged", "-> folded and staged, readable in `serve` (projector thread)"),
)


def load(folder: Path) -> tuple[dict[str, dict[int, tuple[list[int], list[float]]]], list[tuple[float, ...]]]:
    """The events of every process in ``folder``: per kind and partition, (covered offsets, instants),
    each kind's earliest instant per offset; and the reads but long-polls ``(t, total, end, wait, view)``."""
    raw: dict[str, dict[int, list[tuple[int, float]]]] = {k: {} for k, _ in STEPS}
    reads: list[tuple[float, ...]] = []
    for path in sorted(folder.glob("trace-*.txt")):
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split()
            if not parts:
                continue
            try:
                if parts[0] == "read" and len(parts) == 7:
                    if parts[6] == "0":
                        reads.append(tuple(float(x) for x in parts[1:6]))
                elif parts[0] in raw and len(parts) >= 4:
                    # a covered offset: poll's is its last record, the others' the next offset
                    covered = int(parts[3]) if parts[0] == "poll" else int(parts[3]) - 1
                    raw[parts[0]].setdefault(int(parts[2]), []).append((covered, float(parts[1])))
            except ValueError:
                continue  # a line cut short by the process's end
    out: dict[str, dict[int, tuple[list[int], list[float]]]] = {}
    for kind, by_p in raw.items():
        out[kind] = {}
        for p, pairs in by_p.items():
            pairs.sort(key=lambda x: x[1])
            offsets: list[int] = []
            times: list[float] = []
            for o, t in pairs:  # in time order, keep only events that cover more than any before
                if not offsets or o > offsets[-1]:
                    offsets.append(o)
                    times.append(t)
            out[kind][p] = (offsets, times)
    return out, reads


def _first_covering(events: dict[int, tuple[list[int], list[float]]], p: int, o: int) -> float | None:
    offsets, times = events.get(p, ([], []))
    i = bisect.bisect_left(offsets, o)
    return times[i] if i < len(offsets) else None


def breakdown(
    folder: Path, turns: Sequence[tuple[int, int, float, float]], window: tuple[float, float]
) -> dict[str, Any]:
    """Per followed turn ``(partition, offset, acked, readable)`` (the rig's), the instant of each step,
    and the p50 / p90 of each step's milliseconds (from the step before; the first from the broker's
    append); the reads of ``window`` (monotonic seconds) split the same way."""
    from bench.common import percentile

    events, reads = load(folder)
    steps: dict[str, list[float]] = {k: [] for k, _ in STEPS}
    steps["readable"] = []
    joined = 0
    for p, o, acked, readable in turns:
        instants = [_first_covering(events[k], p, o) for k, _ in STEPS]
        if any(t is None for t in instants):
            continue
        joined += 1
        prev = acked
        for (kind, _), t in zip(STEPS, instants, strict=True):
            assert t is not None
            steps[kind].append((t - prev) * 1000)
            prev = max(prev, t)
        steps["readable"].append((readable - prev) * 1000)
    inside = [r for r in reads if window[0] <= r[0] <= window[1]]
    cols: list[list[float]] = [[r[i] for r in inside] for i in range(5)]
    return {
        "turns": len(turns),
        "joined": joined,
        "steps": {k: (percentile(v, 50), percentile(v, 90)) for k, v in steps.items()},
        "reads": len(inside),
        "read": {
            name: (percentile(cols[i], 50), percentile(cols[i], 90))
            for i, name in ((1, "total"), (2, "end offset"), (3, "wait"), (4, "page"))
        },
    }
