"""``throughline ingest`` end to end: the real console script against a real broker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from support.topic import closed_port, read_topic, turn_ids

from throughline.core.identity import canonical_project
from throughline.core.turn import MAX_BODY_BYTES

CLI = str(Path(sys.executable).with_name("throughline"))
SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "turns.jsonl"
RUN_TIMEOUT_S = 120.0
WAIT_TIMEOUT_S = 60.0


def env_for(bootstrap: str, topic: str) -> dict[str, str]:
    env = dict(os.environ)
    env["THROUGHLINE_BOOTSTRAP_SERVERS"] = bootstrap
    env["THROUGHLINE_TOPIC"] = topic
    env.pop("THROUGHLINE_DB", None)
    return env


def ingest(bootstrap: str, topic: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, "ingest", *args],
        input=stdin.decode() if stdin is not None else None,
        env=env_for(bootstrap, topic),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def start_ingest(bootstrap: str, topic: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [CLI, "ingest", *args],
        env=env_for(bootstrap, topic),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextmanager
def running_ingest(bootstrap: str, topic: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """``start_ingest``, killed on the way out if the test left it running."""
    proc = start_ingest(bootstrap, topic, *args)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def turn_line(n: int, project: str = "/p/follow", **extra: object) -> str:
    doc = {
        "project": project,
        "host": "host",
        "thread": "thread",
        "turnId": f"turn-{n:05d}",
        "completedAt": "2026-01-01T00:00:00Z",
        "body": f"body of turn {n}",
        **extra,
    }
    return json.dumps(doc) + "\n"


def append(path: Path, lines: list[str]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(lines))
        f.flush()


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def state_line(state: Path) -> int:
    try:
        return int(json.loads(state.read_text())["line"])
    except (FileNotFoundError, ValueError, KeyError):
        return 0


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    _, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    return proc.returncode, err


# ---------------------------------------------------------------------------------------------- one-shot


def test_the_sample_file_lands_whole_and_in_order(kafka_bootstrap: str, kafka_topic_name: str) -> None:
    result = ingest(kafka_bootstrap, kafka_topic_name, str(SAMPLE))
    docs = [json.loads(line) for line in SAMPLE.read_text("utf-8").splitlines()]
    assert result.returncode == 0, result.stderr
    assert f"ingested {len(docs)} turns from {SAMPLE}, 0 lines rejected" in result.stderr
    records = read_topic(kafka_bootstrap, kafka_topic_name)
    assert Counter((r.turn.host, r.turn.thread, r.turn.turn_id) for r in records) == Counter(
        (d["host"], d["thread"], d["turnId"]) for d in docs
    )
    for project in {d["project"] for d in docs}:
        canonical = canonical_project(project)
        mine = [r for r in records if r.turn.project == canonical]
        assert len({r.partition for r in mine}) == 1
        assert turn_ids(mine) == [d["turnId"] for d in docs if d["project"] == project]
    assert max(r.turn.body_bytes for r in records) >= 90_000


def test_bad_lines_are_rejected_with_their_number_and_the_rest_lands(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_text(
        turn_line(1)
        + "{not json\n"
        + turn_line(3)
        + turn_line(4, body="x" * (MAX_BODY_BYTES + 1))
        + turn_line(5, seq="3")
        + "\n"
        + turn_line(7, completedAt="2026-02-30T00:00:00Z")
        + turn_line(8),
        "utf-8",
    )
    result = ingest(kafka_bootstrap, kafka_topic_name, str(path))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert any(line.startswith("line 2: invalid_json: ") for line in lines)
    assert f"line 4: body_too_large: body is {MAX_BODY_BYTES + 1} bytes; the limit is {MAX_BODY_BYTES} bytes" in lines
    assert any(line.startswith("line 5: invalid_turn: seq") for line in lines)
    assert any(line.startswith("line 7: invalid_turn: completedAt") for line in lines)
    assert not any(line.startswith("line 6:") for line in lines)  # a blank line is skipped, not rejected
    assert f"ingested 3 turns from {path}, 4 lines rejected" in lines
    assert json.loads(lines[-1])["error"]["code"] == "lines_rejected"
    assert sorted(turn_ids(read_topic(kafka_bootstrap, kafka_topic_name))) == ["turn-00001", "turn-00003", "turn-00008"]


def test_standard_input(kafka_bootstrap: str, kafka_topic_name: str) -> None:
    result = ingest(kafka_bootstrap, kafka_topic_name, "-", stdin=(turn_line(1) + turn_line(2)).encode())
    assert result.returncode == 0, result.stderr
    assert "ingested 2 turns from stdin, 0 lines rejected" in result.stderr
    assert turn_ids(read_topic(kafka_bootstrap, kafka_topic_name)) == ["turn-00001", "turn-00002"]
    refused = ingest(kafka_bootstrap, kafka_topic_name, "-", "--state", "s.json", stdin=b"")
    assert refused.returncode == 2
    assert json.loads(refused.stderr.strip().splitlines()[-1])["error"]["code"] == "state_needs_file"


def test_an_unreachable_broker_fails_with_exit_1_naming_it(kafka_topic_name: str, tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(turn_line(1))
    server = f"127.0.0.1:{closed_port()}"
    result = ingest(server, kafka_topic_name, str(path), "--connect-timeout", "2")
    assert result.returncode == 1
    error = json.loads(result.stderr.strip().splitlines()[-1])["error"]
    assert error["code"] == "broker_unavailable" and server in error["message"]


def test_a_lossy_topic_is_refused_unless_allowed(
    kafka_bootstrap: str, kafka_topic_name: str, kafka_create_topic: Callable[..., str], tmp_path: Path
) -> None:
    kafka_create_topic(kafka_topic_name, partitions=1, configs={"retention.ms": "3600000"})
    path = tmp_path / "in.jsonl"
    path.write_text(turn_line(1))
    refused = ingest(kafka_bootstrap, kafka_topic_name, str(path))
    assert refused.returncode == 2
    assert json.loads(refused.stderr.strip().splitlines()[-1])["error"]["code"] == "lossy_topic"
    allowed = ingest(kafka_bootstrap, kafka_topic_name, str(path), "--allow-lossy-topic")
    assert allowed.returncode == 0, allowed.stderr
    assert turn_ids(read_topic(kafka_bootstrap, kafka_topic_name)) == ["turn-00001"]


# ---------------------------------------------------------------------------------------------- follow


def test_follow_stopped_by_sigterm_then_restarted_neither_loses_nor_duplicates(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    path = tmp_path / "live.jsonl"
    state = Path(str(path) + ".ingest-state")
    path.write_text("")
    with running_ingest(kafka_bootstrap, kafka_topic_name, str(path), "--follow", "--poll-interval", "0.05") as proc:
        append(path, [turn_line(n) for n in range(1, 51)])
        wait_for(lambda: state_line(state) == 50, "the state to cover the first 50 lines")
        append(path, [turn_line(n) for n in range(51, 101)])  # SIGTERM lands while these are read
        proc.send_signal(signal.SIGTERM)
        code, err = finish(proc)
    assert code == 0, err
    covered = state_line(state)
    assert 50 <= covered <= 100
    append(path, [turn_line(n) for n in range(101, 151)])
    result = ingest(
        kafka_bootstrap, kafka_topic_name, str(path), "--follow", "--max-idle", "1", "--poll-interval", "0.05"
    )
    assert result.returncode == 0, result.stderr
    assert state_line(state) == 150
    counts = Counter(turn_ids(read_topic(kafka_bootstrap, kafka_topic_name)))
    assert counts == Counter(f"turn-{n:05d}" for n in range(1, 151))


def test_follow_killed_then_restarted_resends_nothing_it_recorded(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    path = tmp_path / "live.jsonl"
    state = tmp_path / "custom.state"
    total = 6000
    path.write_text("".join(turn_line(n, project=f"/p/{n % 5}") for n in range(1, total + 1)))
    with running_ingest(
        kafka_bootstrap, kafka_topic_name, str(path), "--follow", "--state", str(state), "--poll-interval", "0.05"
    ) as proc:
        wait_for(lambda: state_line(state) > 0, "a first state write")
        proc.send_signal(signal.SIGKILL)  # no chance to flush or save
        proc.wait(timeout=30)
    recorded = state_line(state)  # the last state written before the kill
    assert recorded > 0
    result = ingest(
        kafka_bootstrap,
        kafka_topic_name,
        str(path),
        "--follow",
        "--state",
        str(state),
        "--max-idle",
        "1",
        "--poll-interval",
        "0.05",
    )
    assert result.returncode == 0, result.stderr
    assert f"ingested {total - recorded} turns" in result.stderr  # the restart starts right after the state
    counts = Counter(turn_ids(read_topic(kafka_bootstrap, kafka_topic_name)))
    expected = [f"turn-{n:05d}" for n in range(1, total + 1)]
    assert set(counts) == set(expected)  # nothing lost
    # Lines the state covered were acknowledged before the kill and never sent again. Only lines after
    # it may appear twice: acknowledged by the broker, but the kill came before the state recorded them.
    assert all(counts[tid] == 1 for tid in expected[:recorded])


def test_follow_killed_while_idle_then_restarted_is_exactly_once(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    path = tmp_path / "live.jsonl"
    state = Path(str(path) + ".ingest-state")
    path.write_text("".join(turn_line(n) for n in range(1, 21)))
    with running_ingest(kafka_bootstrap, kafka_topic_name, str(path), "--follow", "--poll-interval", "0.05") as proc:
        wait_for(lambda: state_line(state) == 20, "the state to cover every line")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    append(path, [turn_line(n) for n in range(21, 31)])
    result = ingest(
        kafka_bootstrap, kafka_topic_name, str(path), "--follow", "--max-idle", "1", "--poll-interval", "0.05"
    )
    assert result.returncode == 0, result.stderr
    assert "ingested 10 turns" in result.stderr
    assert Counter(turn_ids(read_topic(kafka_bootstrap, kafka_topic_name))) == Counter(
        f"turn-{n:05d}" for n in range(1, 31)
    )


def test_follow_survives_rotation_and_truncation(kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path) -> None:
    path = tmp_path / "rotating.jsonl"
    state = Path(str(path) + ".ingest-state")
    path.write_text("".join(turn_line(n) for n in range(1, 6)))
    with running_ingest(
        kafka_bootstrap, kafka_topic_name, str(path), "--follow", "--poll-interval", "0.05", "--max-idle", "3"
    ) as proc:
        wait_for(lambda: state_line(state) == 5, "the first file")
        append(path, [turn_line(6)])  # written just before the writer rotates: maybe not read yet
        path.rename(tmp_path / "rotating.jsonl.1")
        append(path, [turn_line(n) for n in range(7, 10)])
        wait_for(
            lambda: state_line(state) == 3 and json.loads(state.read_text())["inode"] == path.stat().st_ino,
            "the new file",
        )
        # Truncated in place and rewritten shorter than before, so the truncation shows in the size.
        path.write_text("")
        append(path, [turn_line(n) for n in range(10, 12)])
        code, err = finish(proc)
    assert code == 0, err
    assert "rotated" in err and "truncated" in err
    assert Counter(turn_ids(read_topic(kafka_bootstrap, kafka_topic_name))) == Counter(
        f"turn-{n:05d}" for n in range(1, 12)
    )


def test_a_one_shot_ingest_interrupted_saves_its_state(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    total = 20000
    path = tmp_path / "in.jsonl"
    path.write_text("".join(turn_line(n, project=f"/p/{n % 3}") for n in range(1, total + 1)))
    state = tmp_path / "state"
    with running_ingest(kafka_bootstrap, kafka_topic_name, str(path), "--state", str(state)) as proc:
        wait_for(lambda: state_line(state) > 0 or proc.poll() is not None, "a first state write")
        proc.send_signal(signal.SIGINT)
        code, err = finish(proc)
    covered = state_line(state)
    if code == 130:  # interrupted before the end
        assert json.loads(err.strip().splitlines()[-1])["error"]["code"] == "interrupted"
    else:  # it finished before the signal arrived
        assert code == 0 and covered == total, err
    rest = ingest(kafka_bootstrap, kafka_topic_name, str(path), "--state", str(state))
    assert rest.returncode == 0, rest.stderr
    assert f"ingested {total - covered} turns" in rest.stderr
    counts = Counter(turn_ids(read_topic(kafka_bootstrap, kafka_topic_name)))
    assert len(counts) == total and set(counts.values()) == {1}
