"""``ingest --settle``: a session file idle for the settle time is final, its parser's ``settle()`` turns
are sent after its last line, and the state keeps a restart from sending them twice or losing them.

The host parsers of this branch settle nothing yet, so a toy ``SessionParser`` stands in: a line
``{"p": ID}`` starts a turn (and, like Claude Code's "next prompt" rule, completes the open one that has
a reply, with a body that says so); ``{"r": TEXT}`` adds to the reply; ``{"end": true}`` completes the
turn. ``settle()`` completes the open turn when it has a reply. The broker is the in-memory sender of
test_ingest_reader.
"""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path
from typing import Any

from test_ingest_reader import FakeSender

from throughline.producers.hosts.lines import SessionParser
from throughline.producers.hosts.render import HostTurn
from throughline.producers.ingest import Ingest
from throughline.producers.ingest.sessions import SessionDecoder, SessionFiles, SessionsState
from throughline.producers.ingest.state import load_session_states, save_session_states


class ToyParser(SessionParser):
    host = "toy"

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.seq = 0
        self.current: tuple[str, list[str], int] | None = None  # (id, reply parts, first line)

    @property
    def open_turn(self) -> bool:
        return self.current is not None

    def _complete(self, number: int, how: str) -> list[HostTurn]:
        assert self.current is not None
        turn_id, parts, _ = self.current
        self.current = None
        if not parts:
            return []
        self.seq += 1
        body = f"{' '.join(parts)} ({how})"
        return [
            HostTurn(
                "toy",
                "T",
                "/w",
                turn_id,
                1_700_000_000_000_000 + number,
                body,
                self.seq,
                number,
                {"ingest.format": "toy", "ingest.line": str(number), "turn.outcome": "answered"},
            )
        ]

    def take(self, number: int, entry: dict[str, Any]) -> list[HostTurn]:
        if "p" in entry:
            done = self._complete(number, "next prompt") if self.current else []
            self.current = (entry["p"], [], number)
            return done
        if "r" in entry and self.current:
            self.current[1].append(entry["r"])
        if entry.get("end") and self.current:
            return self._complete(number, "end")
        return []

    def settle(self, final: bool = False) -> list[HostTurn]:
        if self.current is None or not self.current[1]:
            return []
        return self._complete(0, "settled")


#: The files are found as this host's (a registered one); their lines are read by the toy parser.
FORMAT = "claude-code"


def toy(format: str, path: str) -> SessionParser:
    return ToyParser()


def lines(*entries: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in entries)


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def run_once(
    path: Path, state: str, settle: float | None, sender: FakeSender | None = None
) -> tuple[FakeSender, SessionFiles]:
    sender = sender or FakeSender()
    saved = load_session_states(state, format=FORMAT)
    files = SessionFiles(FORMAT, [str(path)], states=saved, settle=settle, parsers=toy)
    decoder = SessionDecoder(files, warn=lambda m: None)
    Ingest(
        files,
        sender,
        state_path=state,
        decoder=decoder,
        err=io.StringIO(),
        state=SessionsState(state, files, saved),
    ).run()
    return sender, files


def bodies(sender: FakeSender) -> list[tuple[str, int | None, str]]:
    return [(p.turn.turn_id, p.turn.seq, p.turn.body) for p in sender.sent]


FIRST = lines({"p": "t1"}, {"r": "one"}, {"end": True}, {"p": "t2"}, {"r": "two"})


def test_settle_zero_sends_the_open_turn_after_the_last_line_and_a_rerun_reads_nothing(
    tmp_path: Path,
) -> None:
    path, state = tmp_path / "s.jsonl", str(tmp_path / "state.json")
    path.write_bytes(FIRST)
    sender, _ = run_once(path, state, settle=0)
    assert bodies(sender) == [("t1", 1, "one (end)"), ("t2", 2, "two (settled)")]
    saved = load_session_states(state, format=FORMAT)[str(path)]
    assert (saved.line, saved.offset, saved.settled, saved.settled_end) == (5, len(FIRST), (5,), True)
    again, files = run_once(path, state, settle=0)
    assert again.sent == [] and all(t.parser is None for t in files.tracked.values())  # not even read


def test_one_shot_settles_only_a_file_idle_for_the_settle_time(tmp_path: Path) -> None:
    path, state = tmp_path / "s.jsonl", str(tmp_path / "state.json")
    path.write_bytes(FIRST)
    sender, _ = run_once(path, state, settle=120)
    assert [t for t, _, _ in bodies(sender)] == ["t1"]  # written just now: maybe still going on
    assert load_session_states(state, format=FORMAT)[str(path)].settled_end is False
    age(path, 121)
    later, _ = run_once(path, state, settle=120)  # unchanged since the state, but now due: read again
    assert bodies(later) == [("t2", 2, "two (settled)")]
    none, _ = run_once(path, state, settle=None)  # the hooks' default: never settles
    assert none.sent == []


def test_a_file_that_grows_after_a_settle_is_read_on_as_settled_never_sending_the_turn_twice(
    tmp_path: Path,
) -> None:
    path, state = tmp_path / "s.jsonl", str(tmp_path / "state.json")
    path.write_bytes(FIRST)
    run_once(path, state, settle=0)
    with open(path, "ab") as f:
        f.write(lines({"p": "t3"}, {"r": "three"}, {"end": True}))
    age(path, 10)
    # Without the replayed settle, the fresh parser would complete t2 at t3's prompt ("next prompt")
    # with other content: the projector would see turn id t2 again with another body.
    sender, _ = run_once(path, state, settle=120)
    assert bodies(sender) == [("t3", 3, "three (end)")]
    saved = load_session_states(state, format=FORMAT)[str(path)]
    assert (saved.line, saved.settled, saved.settled_end) == (8, (5,), False)


def test_a_settled_turn_the_broker_did_not_acknowledge_is_sent_again(tmp_path: Path) -> None:
    from throughline.log.exceptions import BrokerUnavailableError

    path, state = tmp_path / "s.jsonl", str(tmp_path / "state.json")
    path.write_bytes(FIRST)
    failing = FakeSender({"t2": BrokerUnavailableError(["127.0.0.1:1"], "down")})
    try:
        run_once(path, state, settle=0, sender=failing)
    except BrokerUnavailableError:
        pass
    saved = load_session_states(state, format=FORMAT)[str(path)]
    assert (saved.line, saved.settled, saved.settled_end) == (
        5,
        (),
        False,
    )  # line 5 acknowledged, its settle not
    sender, _ = run_once(path, state, settle=0)
    assert bodies(sender) == [("t2", 2, "two (settled)")]  # nothing lost, nothing sent twice


def test_a_state_with_a_settle_a_rewritten_file_no_longer_holds_is_not_replayed(tmp_path: Path) -> None:
    path, state = tmp_path / "s.jsonl", str(tmp_path / "state.json")
    path.write_bytes(FIRST)
    run_once(path, state, settle=0)
    other = lines({"p": "u1"}, {"r": "x"}, {"end": True}, {"p": "u2"}, {"r": "y"}, {"r": "z"}, {"end": True})
    path.write_bytes(other)  # rewritten in place: line 5 is another line now
    sender, _ = run_once(path, state, settle=None)
    assert bodies(sender) == [("u1", 1, "x (end)"), ("u2", 2, "y z (end)")]  # no settle after line 5


def test_following_settles_an_idle_file_once_and_reads_on_with_the_same_parser(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(FIRST)
    files = SessionFiles(FORMAT, [str(path)], follow=True, poll_interval=0.01, settle=0.3, parsers=toy)
    sender = FakeSender()
    ingest = Ingest(files, sender, decoder=SessionDecoder(files, warn=lambda m: None), err=io.StringIO())
    files.covered = ingest.covered_line

    def poll() -> None:
        for line in files.lines():
            ingest._handle(line)
        ingest._collect(wait=True)

    poll()
    assert [t for t, _, _ in bodies(sender)] == ["t1"]  # just written
    age(path, 1)
    poll()
    poll()  # settled once, not on every idle poll
    assert bodies(sender)[1:] == [("t2", 2, "two (settled)")]
    mark = ingest.covered_line(str(path))
    assert mark is not None and mark.settled and mark.number == 5
    with open(path, "ab") as f:
        f.write(lines({"p": "t3"}, {"r": "three"}))
    poll()
    assert len(sender.sent) == 2  # t3 is open; t2 is not completed again by t3's prompt
    age(path, 1)
    poll()
    assert bodies(sender)[2:] == [("t3", 3, "three (settled)")]


def test_an_evicted_parser_is_rebuilt_with_its_settles(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(FIRST)
    age(path, 1)
    files = SessionFiles(FORMAT, [str(path)], follow=True, poll_interval=0.01, settle=0.3, parsers=toy, evict_after=0.0)
    sender = FakeSender()
    ingest = Ingest(files, sender, decoder=SessionDecoder(files, warn=lambda m: None), err=io.StringIO())
    files.covered = ingest.covered_line
    for line in files.lines():
        ingest._handle(line)
    ingest._collect(wait=True)
    list(files.check_file())
    t = files.tracked[str(path)]
    assert t.parser is None and t.saved is not None and (t.saved.settled, t.saved.settled_end) == ((5,), True)
    with open(path, "ab") as f:
        f.write(lines({"p": "t3"}, {"r": "three"}, {"end": True}))
    for line in files.lines():
        ingest._handle(line)
    assert bodies(sender) == [("t1", 1, "one (end)"), ("t2", 2, "two (settled)"), ("t3", 3, "three (end)")]


def test_the_settles_survive_the_state_file(tmp_path: Path) -> None:
    path, state = tmp_path / "s.jsonl", str(tmp_path / "state.json")
    path.write_bytes(FIRST)
    run_once(path, state, settle=0)
    saved = load_session_states(state, format=FORMAT)
    doc = json.loads(Path(state).read_text())
    assert doc["files"][str(path)]["settled"] == [5] and doc["files"][str(path)]["settledEnd"] is True
    save_session_states(state, saved, format=FORMAT)
    assert load_session_states(state, format=FORMAT) == saved


def test_a_state_saved_between_a_line_and_its_replayed_settle_keeps_the_settle(tmp_path: Path) -> None:
    path, state = tmp_path / "s.jsonl", str(tmp_path / "state.json")
    path.write_bytes(FIRST)
    run_once(path, state, settle=0)
    with open(path, "ab") as f:
        f.write(lines({"p": "t3"}, {"r": "three"}, {"end": True}))
    saved = load_session_states(state, format=FORMAT)
    files = SessionFiles(FORMAT, [str(path)], states=saved, settle=None, parsers=toy)
    sender = FakeSender()
    ingest = Ingest(
        files,
        sender,
        state_path=state,
        decoder=SessionDecoder(files, warn=lambda m: None),
        err=io.StringIO(),
        state=SessionsState(state, files, saved),
    )
    for line in files.lines():
        ingest._handle(line)
        if line.number == 5 and not line.settle:
            ingest.save(force=True)  # line 5 covered, its replayed settle not handled yet
            kept = load_session_states(state, format=FORMAT)[str(path)]
            assert (kept.line, kept.settled, kept.settled_end) == (5, (5,), True)
    ingest._collect(wait=True)
    ingest.save(force=True)
    assert [t for t, _, _ in bodies(sender)] == ["t3"]
    assert load_session_states(state, format=FORMAT)[str(path)].settled == (5,)
