"""A rebuild's replay in its child process (``ReplayProcess``) against a real broker: it folds the topic into
the file while reporting its applied offsets, lowers its own CPU priority, lets the file go once it says it
is done (the same tables a replay in process gives) with its turn keys handed over, and a failure in the child reaches the parent as a
typed error with the child's own message."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from test_serve import produce, turn

from throughline.projector.exceptions import ReplayProcessError
from throughline.projector.rebuild_files import turn_keys_of
from throughline.projector.rebuild_replay import ReplayProcess
from throughline.projector.runner import Projector
from throughline.projector.store import DuckProjection

pytestmark = pytest.mark.integration

BOUND = 60.0
TURNS = 40


def _topic(name: str) -> str:
    return f"t-{name}-{os.getpid()}-{int(time.time() * 1000) % 10**8}"


def _niceness(pid: int) -> int:
    """Field 19 of /proc/PID/stat (after the command's closing parenthesis)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])


def test_the_replay_child_folds_the_topic_reports_it_and_lets_the_file_go(kafka_bootstrap: str, tmp_path: Path) -> None:
    topic = _topic("replay-child")
    produce(kafka_bootstrap, topic, [turn(n, seq=n) for n in range(1, TURNS + 1)])
    path = tmp_path / "p.duckdb.rebuild"
    replay = ReplayProcess(path, [kafka_bootstrap], topic)
    replay.start()
    try:
        deadline = time.monotonic() + BOUND
        while sum(replay.offsets().values()) < TURNS and time.monotonic() < deadline:
            replay.raise_failure()
            time.sleep(0.05)
        assert sum(replay.offsets().values()) == TURNS  # every record, as its progress lines say
        child = replay._proc
        assert child is not None and _niceness(child.pid) >= _niceness(os.getpid()) + 10
    finally:
        replay.stop(BOUND)
    replay.raise_failure()  # asked, and done: nothing to raise
    with DuckProjection.open(path, topic=topic) as rebuilt:  # the child let the file go (DuckDB's lock)
        assert sum(rebuilt.applied_offsets().values()) == TURNS
        digests = rebuilt.table_digests()
        # It kept the new file's turn keys and handed them over: adopted, no scan of turn_ids needed.
        assert rebuilt.adopt_turn_keys(turn_keys_of(path))
        assert rebuilt._staging.stored_keys.ready
    with DuckProjection.open(tmp_path / "in-process.duckdb", topic=topic) as fresh:
        assert Projector(fresh, kafka_bootstrap, topic).run(until_caught_up=True).caught_up
        assert fresh.table_digests() == digests


def test_a_failure_in_the_child_reaches_the_parent_with_its_message(kafka_bootstrap: str, tmp_path: Path) -> None:
    path = tmp_path / "p.duckdb.rebuild"
    with DuckProjection.open(path, topic="another-topic"):
        pass  # a file bound to another topic: the child refuses to write this topic into it
    replay = ReplayProcess(path, [kafka_bootstrap], _topic("replay-child-refused"))
    replay.start()
    deadline = time.monotonic() + BOUND
    with pytest.raises(ReplayProcessError, match="the rebuild's replay failed: ProjectionTopicMismatchError"):
        while time.monotonic() < deadline:
            replay.raise_failure()
            time.sleep(0.05)
    replay.stop(BOUND)
