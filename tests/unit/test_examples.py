"""``examples/turns.jsonl`` is what ``examples/make_sample.py`` writes, and every line is a valid turn."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import defaultdict
from pathlib import Path
from types import ModuleType

from throughline.core.turn import MAX_BODY_BYTES
from throughline.producers.ingest import parse_turn_line

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _make_sample() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_sample", EXAMPLES / "make_sample.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_sample", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_committed_sample_is_what_the_generator_writes() -> None:
    sample = _make_sample()
    assert (EXAMPLES / "turns.jsonl").read_text("utf-8") == sample.render(sample.generate())


def test_sample_lines_are_valid_and_cover_the_features() -> None:
    raw_lines = (EXAMPLES / "turns.jsonl").read_bytes().splitlines()
    turns = [parse_turn_line(raw) for raw in raw_lines]
    assert len(turns) >= 200 and all(t is not None for t in turns)
    docs = [json.loads(raw) for raw in raw_lines]
    assert len({t.project for t in turns if t}) >= 3
    assert len({t.host for t in turns if t}) >= 3
    assert len({(t.project, t.host, t.thread) for t in turns if t}) >= 6
    times = [t.completed_at_micros for t in turns if t]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert any("\n" in t.body for t in turns if t)
    assert any(not t.body.isascii() for t in turns if t)
    big = [t.body_bytes for t in turns if t and t.body_bytes >= 90_000]
    assert len(big) == 1 and big[0] <= MAX_BODY_BYTES
    # A rollback: some seq at or below the length its source had reached.
    length: dict[tuple[str, str, str], int] = defaultdict(int)
    rollbacks = 0
    for d in docs:
        key = (d["project"], d["host"], d["thread"])
        seq = d.get("seq")
        if seq is not None and seq <= length[key]:
            rollbacks += 1
        length[key] = seq if seq is not None else length[key] + 1
    assert rollbacks >= 1
    # A host switch: one project's turns come from more than one host, one after the other.
    hosts_by_project: dict[str, list[str]] = defaultdict(list)
    for d in docs:
        hosts = hosts_by_project[d["project"]]
        if not hosts or hosts[-1] != d["host"]:
            hosts.append(d["host"])
    assert any(len(set(h)) > 1 for h in hosts_by_project.values())
