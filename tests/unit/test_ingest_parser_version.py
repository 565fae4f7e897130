"""A host parser's version in the ingest state: a file saved under another parser version is sent again
from line 1, so a follower or hook restarted with a newer parser never leaves its thread a seq gap.

Toy parsers stand in (``ToyParser`` of test_ingest_settle): ``OldToy`` ignores an interrupted prompt
(``{"x": TEXT}``), ``NewToy`` (a newer version) counts it as a turn, so from it on the two number the
turns differently. The records sent are folded by the reference fold (``ChainBook``) as the projector
would: the newer parser's whole file after the older one's chain ends with its chain, nothing refused.
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

from test_ingest_reader import FakeSender
from test_ingest_settle import FORMAT, ToyParser, lines, run_once

from throughline.core.fold import ChainBook
from throughline.producers.hosts.files import new_parser
from throughline.producers.hosts.lines import SessionParser
from throughline.producers.hosts.render import HostTurn
from throughline.producers.ingest import Ingest
from throughline.producers.ingest.sessions import SessionDecoder, SessionFiles, SessionsState
from throughline.producers.ingest.state import load_session_states, save_session_states


class OldToy(ToyParser):
    version = 1


class NewToy(ToyParser):
    version = 2

    def take(self, number: int, entry: dict[str, Any]) -> list[HostTurn]:
        if "x" in entry:  # an interrupted prompt: a turn of its own
            done = self._complete(number, "next prompt") if self.current else []
            self.current = (f"x{number}", [entry["x"]], number)
            return [*done, *self._complete(number, "interrupted")]
        return super().take(number, entry)


def run_with(parser: type[ToyParser], path: Path, state: str, monkeypatch: Any) -> FakeSender:
    def make(format: str, path: str) -> SessionParser:
        return parser()

    monkeypatch.setattr("test_ingest_settle.toy", make)
    sender, _ = run_once(path, state, settle=None)
    return sender


def sent(sender: FakeSender) -> list[tuple[str, int | None]]:
    return [(p.turn.turn_id, p.turn.seq) for p in sender.sent]


FILE = lines({"p": "t1"}, {"r": "one"}, {"end": True}, {"x": "stop"}, {"p": "t2"}, {"r": "two"}, {"end": True})
MORE = lines({"p": "t3"}, {"r": "three"}, {"end": True})


def test_the_state_records_the_parser_version(tmp_path: Path, monkeypatch: Any) -> None:
    path, state = tmp_path / "s.jsonl", str(tmp_path / "state.json")
    path.write_bytes(FILE)
    assert sent(run_with(OldToy, path, state, monkeypatch)) == [("t1", 1), ("t2", 2)]
    assert load_session_states(state, format=FORMAT)[str(path)].parser_version == 1
    with open(state, encoding="utf-8") as f:
        assert json.load(f)["files"][str(path)]["parserVersion"] == 1
    # the same version again: an unchanged file is not read, a grown one sends only its new turns
    assert sent(run_with(OldToy, path, state, monkeypatch)) == []
    with open(path, "ab") as f:
        f.write(MORE)
    assert sent(run_with(OldToy, path, state, monkeypatch)) == [("t3", 3)]


def test_a_newer_parser_sends_the_file_again_from_line_1_and_the_fold_takes_its_chain(
    tmp_path: Path, monkeypatch: Any
) -> None:
    path, state = tmp_path / "s.jsonl", str(tmp_path / "state.json")
    path.write_bytes(FILE)
    old = run_with(OldToy, path, state, monkeypatch)
    with open(path, "ab") as f:
        f.write(MORE)
    new = run_with(NewToy, path, state, monkeypatch)
    # not only t3 (which the new parser numbers 4: a gap after the old chain of 2), the whole file
    assert sent(new) == [("t1", 1), ("x4", 2), ("t2", 3), ("t3", 4)]
    assert load_session_states(state, format=FORMAT)[str(path)].parser_version == 2
    book = ChainBook()
    for offset, record in enumerate([p.turn for p in (*old.sent, *new.sent)]):
        book.apply(record, 0, offset)
    assert not book.quarantined and not book.broken
    (chain,) = book.live.values()
    assert [(t.turn_id, t.seq) for t in chain] == sent(new)
    # from then on, the new version resumes as usual
    assert sent(run_with(NewToy, path, state, monkeypatch)) == []


def test_a_state_from_before_versions_is_an_older_parser_even_for_an_unchanged_file(
    tmp_path: Path, monkeypatch: Any
) -> None:
    path, state = tmp_path / "s.jsonl", str(tmp_path / "state.json")
    path.write_bytes(FILE)
    run_with(OldToy, path, state, monkeypatch)
    saved = load_session_states(state, format=FORMAT)
    save_session_states(
        state, {p: dataclasses.replace(s, parser_version=None) for p, s in saved.items()}, format=FORMAT
    )
    with open(state, encoding="utf-8") as f:
        assert "parserVersion" not in json.load(f)["files"][str(path)]  # absent: the parser before versions
    assert sent(run_with(OldToy, path, state, monkeypatch)) == [("t1", 1), ("t2", 2)]  # version 1 != 0
    assert sent(run_with(OldToy, path, state, monkeypatch)) == []


def test_the_hosts_parsers_have_a_version() -> None:
    assert SessionParser.version == 0  # the parsers before versions, as a state without one says
    for format in ("claude-code", "codex"):
        assert new_parser(format, "/tmp/x.jsonl").version >= 1


def test_the_hook_follows_the_version_too(tmp_path: Path) -> None:
    """The hook's run (``throughline/commands/hook.py``): one transcript, its own state, settled at once as final."""
    path, state = tmp_path / "s.jsonl", str(tmp_path / "state.json")

    def hook(parser: type[ToyParser]) -> FakeSender:
        saved = load_session_states(state, format=FORMAT)
        files = SessionFiles(
            FORMAT,
            [str(path)],
            follow=False,
            states=saved,
            settle=0.0,
            final=True,
            parsers=lambda f, p: parser(),
        )
        sender = FakeSender()
        Ingest(
            files,
            sender,
            state_path=state,
            state=SessionsState(state, files, saved),
            decoder=SessionDecoder(files, warn=lambda m: None),
            err=io.StringIO(),
        ).run()
        return sender

    path.write_bytes(FILE)
    assert sent(hook(OldToy)) == [("t1", 1), ("t2", 2)]
    with open(path, "ab") as f:
        f.write(MORE)
    assert sent(hook(NewToy)) == [("t1", 1), ("x4", 2), ("t2", 3), ("t3", 4)]
    assert load_session_states(state, format=FORMAT)[str(path)].parser_version == 2
    assert sent(hook(NewToy)) == []
