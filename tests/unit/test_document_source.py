"""Whole-document sessions (Gemini CLI's ``session-*.json`` of earlier versions) read as records: a
rewrite that appends presents only the new records, a rewrite that changes history starts the session
over with a fresh parser, and the JSON Lines files of the same host are read beside them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from throughline.producers.hosts.records import CombinedSource, DocumentSource
from throughline.producers.hosts.registry import adapter
from throughline.producers.hosts.sources import session_source

LEGACY = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "adapters" / "gemini-cli-legacy"
NAME = "session-2025-11-01T09-00-0ld0c0de.json"


def copy(tmp_path: Path) -> Path:
    shutil.copytree(LEGACY, tmp_path / "g")
    return tmp_path / "g" / "tmp" / "old-proj" / "chats" / NAME


def rewrite(path: Path, messages: list[dict]) -> None:
    doc = json.loads(path.read_text())
    doc["messages"] = messages
    path.write_text(json.dumps(doc, indent=2) + "\n")


def test_a_rewrite_that_appends_presents_only_the_new_records(tmp_path: Path) -> None:
    path = copy(tmp_path)
    src = DocumentSource(adapter("gemini-cli"), [str(path)], follow=True)
    first = list(src.lines())
    assert [line.number for line in first] == [1, 2, 3, 4, 5, 6]  # the metadata, then five messages
    assert list(src.lines()) == []  # unchanged: not read again
    messages = json.loads(path.read_text())["messages"]
    new = {"id": "old-u3", "timestamp": "2025-11-01T09:03:00.000Z", "type": "user", "content": "Thanks."}
    rewrite(path, [*messages, new])
    assert [(line.number, json.loads(line.data)["id"]) for line in src.lines()] == [(7, "old-u3")]
    t, parser = src.parser_of(first[0]) or (None, None)
    assert t is not None and t.generation == 0


def test_a_rewrite_that_changes_history_starts_the_session_over(tmp_path: Path) -> None:
    path = copy(tmp_path)
    src = DocumentSource(adapter("gemini-cli"), [str(path)], follow=True)
    old = list(src.lines())
    messages = json.loads(path.read_text())["messages"]
    rewrite(path, messages[:2])  # rewound to after the first answer
    again = list(src.lines())
    assert [line.number for line in again] == [1, 2, 3] and again[0].generation == 1
    assert src.parser_of(old[0]) is None  # a line of the old generation belongs to no parser
    assert src.parser_of(again[0]) is not None


def test_the_host_source_reads_documents_beside_json_lines(tmp_path: Path) -> None:
    copy(tmp_path)
    src = session_source("gemini-cli", [str(tmp_path / "g")])
    assert isinstance(src, CombinedSource)
    paths = {Path(line.path).name for line in src.lines()}
    assert paths == {NAME, "session-2025-11-02T09-00-c0nv0000.jsonl"}  # the converted .json is left out
    assert src.eof
    src.close()
