"""The small shared settings values: the fetching consumers' ``FetchSettings``, the whole-number flag
parser every CLI uses (``count_argument``), and the harness's ``closed_on_failure`` and ``run_tool``. No broker."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from throughline.commands.options import count_argument
from throughline.log import FetchSettings
from throughline.testing.kafka.exceptions import HarnessError, MavenFetchError
from throughline.testing.kafka.handle import closed_on_failure
from throughline.testing.kafka.support import run_tool


def test_fetch_settings_never_commit_reset_or_create_and_bound_each_request() -> None:
    settings = FetchSettings(
        max_poll_records=7, fetch_max_bytes=4096, max_partition_fetch_bytes=1024, fetch_max_wait_ms=250
    )
    kafka = settings.kafka_settings(timeout=15.0)
    assert kafka["enable_auto_commit"] is False
    assert kafka["auto_offset_reset"] == "none"
    assert kafka["isolation_level"] == "read_committed"
    assert kafka["allow_auto_create_topics"] is False
    assert (kafka["max_poll_records"], kafka["fetch_max_bytes"]) == (7, 4096)
    assert (kafka["max_partition_fetch_bytes"], kafka["fetch_max_wait_ms"]) == (1024, 250)
    assert kafka["request_timeout_ms"] == 15_000


def test_a_request_outlasts_the_fetch_wait_even_under_a_short_timeout() -> None:
    kafka = FetchSettings(fetch_max_wait_ms=5_000).kafka_settings(timeout=0.1)
    assert kafka["request_timeout_ms"] == 6_000


def test_count_argument_takes_whole_numbers_from_its_minimum() -> None:
    parse = count_argument(2)
    assert parse("2") == 2 and parse("40") == 40
    for text, message in (("1", "must be at least 2"), ("x", "not an integer"), ("2.5", "not an integer")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            parse(text)


class _Handle:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def test_closed_on_failure_closes_only_when_the_block_raises() -> None:
    handle = _Handle()
    with closed_on_failure(handle):
        pass
    assert handle.closed == 0
    with pytest.raises(KeyboardInterrupt), closed_on_failure(handle):
        raise KeyboardInterrupt
    assert handle.closed == 1


def test_run_tool_returns_the_finished_run_and_leaves_the_exit_code_to_the_caller(tmp_path: Path) -> None:
    done = run_tool(
        [sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], cwd=tmp_path, timeout_s=30, what="t"
    )
    assert (done.returncode, done.stdout.strip()) == (3, b"out")


def test_run_tool_raises_the_callers_error_when_a_tool_overruns_or_cannot_start(tmp_path: Path) -> None:
    with pytest.raises(MavenFetchError, match="slow did not finish within 0s"):
        run_tool(
            [sys.executable, "-c", "import time; time.sleep(30)"],
            cwd=tmp_path,
            timeout_s=0.2,
            what="slow",
            error=MavenFetchError,
        )
    with pytest.raises(HarnessError, match="could not run"):
        run_tool([str(tmp_path / "no-such-tool")], cwd=tmp_path, timeout_s=5, what="missing")
