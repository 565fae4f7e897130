"""OpenCode's JSON tree (``storage/``) as a line source: both layouts present the records the SQLite store
presents for the same session, in OpenCode's order, a message once final; a file being written waits for
the next poll; following reads only what changed; a deleted message becomes a ``removed`` record; a session
the store holds too is read once, from the store; and a Hypothesis property: the tree and the store give
the same turns for the same session."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.opencode_store import add_message, add_session, build_store, open_store
from support.opencode_tree import message_file, session_file, write_tree

from throughline.producers.hosts import opencode_tree
from throughline.producers.hosts.opencode_db import OpenCodeSource
from throughline.producers.hosts.opencode_tree import OpenCodeTreeSource, trees_at
from throughline.producers.hosts.registry import adapter
from throughline.testing.hosts import parse_records, turn_key

ADAPTED = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "adapters"
ROWS = ADAPTED / "opencode" / "rows.json"
BASE = 1777629600000
HOST = adapter("opencode")


def age(root: Path, seconds: float = 3600) -> None:
    """Every file and folder under ``root`` last modified ``seconds`` ago (past the fresh window)."""
    then = os.stat(root).st_mtime - seconds
    for folder, _, names in os.walk(root):
        for name in [*names, ""]:
            os.utime(os.path.join(folder, name), (then, then))


def tree_source(*roots: Path, **options: Any) -> OpenCodeTreeSource:
    return OpenCodeTreeSource(HOST, [str(r) for r in roots], **options)


def records(src: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(line.path.rpartition("#")[2], json.loads(line.data)) for line in src.lines()]


def ids(recs: list[tuple[str, dict[str, Any]]]) -> list[str | list[str]]:
    return [r["message"]["id"] if "message" in r else r["removed"] for _, r in recs]


def store_records(tmp: Path) -> list[tuple[str, dict[str, Any]]]:
    (tmp / "db").mkdir(exist_ok=True)
    src = OpenCodeSource(HOST, [str(build_store(tmp / "db" / "opencode.db", ROWS))])
    try:
        return records(src)
    finally:
        src.close()


def user(mid: str, second: int, text: str = "hi", session: str = "ses_1") -> dict[str, Any]:
    return {
        "id": mid,
        "session": session,
        "created": BASE + second * 1000,
        "data": {"role": "user", "time": {"created": BASE + second * 1000}},
        "parts": [{"id": f"prt_{mid}", "data": {"type": "text", "text": text}}],
    }


def reply(mid: str, second: int, text: str = "done.", *, done: bool = True, session: str = "ses_1") -> dict[str, Any]:
    t: dict[str, Any] = {"created": BASE + second * 1000}
    data: dict[str, Any] = {"role": "assistant", "time": t, "path": {"cwd": "/work/oc", "root": "/work/oc"}}
    if done:
        t["completed"] = BASE + second * 1000 + 500
        data["finish"] = "stop"
    return {
        "id": mid,
        "session": session,
        "created": BASE + second * 1000,
        "data": data,
        "parts": [{"id": f"prt_{mid}", "data": {"type": "text", "text": text}}],
    }


def fresh_session(storage: Path, sid: str = "ses_1", directory: str = "/work/oc", legacy: bool = False) -> None:
    session = {"id": sid, "directory": directory, "parent_id": None, "title": "t", "created": BASE}
    session_file(storage, session, legacy=legacy)


# ------------------------------------------------------------------------------------------------ layouts


@pytest.mark.parametrize("legacy", [False, True])
def test_each_layout_presents_the_records_the_store_presents(tmp_path: Path, legacy: bool) -> None:
    storage = tmp_path / "data" / ("project/work-oc/storage" if legacy else "storage")
    write_tree(storage, ROWS, legacy=legacy)
    got = records(tree_source(tmp_path / "data"))
    assert got == store_records(tmp_path)
    assert len(got) == 9  # ses_1's nine messages (ses_2's only message has no later one: not final yet)


def test_a_data_folder_holding_both_layouts_reads_a_session_once_from_the_later_one(tmp_path: Path) -> None:
    shutil.copytree(ADAPTED / "opencode-tree", tmp_path / "opencode")
    src = tree_source(tmp_path / "opencode")
    got = records(src)
    assert got == store_records(tmp_path)
    assert {line_path.rpartition("#")[0] for line_path in src.tracked} == {str(tmp_path / "opencode" / "storage")}


def test_a_path_names_a_tree_or_one_session(tmp_path: Path) -> None:
    storage = write_tree(tmp_path / "opencode" / "storage", ROWS)
    legacy = write_tree(tmp_path / "old" / "storage", ROWS, legacy=True)
    named = {
        storage: None,
        tmp_path / "opencode": None,
        storage / "message": None,
        storage / "message" / "ses_1": "ses_1",
        storage / "message" / "ses_1" / "msg_03.json": "ses_1",
        storage / "session" / opencode_tree_project() / "ses_2.json": "ses_2",
        legacy / "session" / "info" / "ses_1.json": "ses_1",
        legacy / "session" / "message" / "ses_2": "ses_2",
        legacy / "session" / "part" / "ses_1" / "msg_02": "ses_1",
    }
    for path, session in named.items():
        assert [only for _, only in trees_at(str(path))] == [session], path
    assert trees_at(str(storage / "part" / "msg_02" / "prt_03.json")) == []  # names a message, not a session
    assert trees_at(str(tmp_path)) == []
    assert {s for s, _ in records(tree_source(storage / "message" / "ses_1"))} == {"ses_1"}


def opencode_tree_project() -> str:
    from support.opencode_tree import PROJECT

    return PROJECT


def test_a_session_the_store_holds_is_read_from_the_store_only(tmp_path: Path) -> None:
    data = tmp_path / "opencode"
    storage = write_tree(data / "storage", ROWS)
    fresh_session(storage, "ses_3")
    for m in (user("msg_30", 70, session="ses_3"), reply("msg_31", 71, session="ses_3")):
        message_file(storage, m)
    build_store(data / "opencode.db", ROWS)
    notices: list[str] = []
    src = HOST.open_source([str(data)], follow=False, states={}, poll_interval=0.1, notice=notices.append)
    got = [(line.path, json.loads(line.data)) for line in src.lines()]
    from_store = {p.rpartition("#")[2] for p, _ in got if p.startswith(str(data / "opencode.db"))}
    from_tree = {p.rpartition("#")[2] for p, _ in got if p.startswith(str(storage))}
    assert (from_store, from_tree) == ({"ses_1"}, {"ses_3"})
    assert any("2 sessions are in the SQLite store too" in n for n in notices)
    src.close()


# ----------------------------------------------------------------------------------------- order, partials


def test_messages_come_in_id_order_whatever_order_their_files_were_written(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    fresh_session(storage)
    for m in (reply("msg_04", 4), user("msg_03", 3), reply("msg_02", 2), user("msg_01", 1)):
        message_file(storage, m)
    parts = storage / "part" / "msg_02"
    (parts / "prt_msg_02.json").rename(parts / "prt_b.json")
    (parts / "prt_a.json").write_text(json.dumps({"type": "text", "text": "first"}))
    got = records(tree_source(storage))
    assert ids(got) == ["msg_01", "msg_02", "msg_03", "msg_04"]
    assert [p["id"] for p in got[1][1]["parts"]] == ["prt_a", "prt_b"]


def test_a_file_being_written_holds_back_its_session_until_it_is_whole(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    fresh_session(storage)
    for m in (user("msg_01", 1), reply("msg_02", 2), user("msg_03", 3), reply("msg_04", 4)):
        message_file(storage, m)
    whole = (storage / "message" / "ses_1" / "msg_02.json").read_text()
    (storage / "message" / "ses_1" / "msg_02.json").write_text(whole[: len(whole) // 2])
    part = storage / "part" / "msg_04" / "prt_msg_04.json"
    part_text = part.read_text()
    part.write_text(part_text[:10])
    notices: list[str] = []
    src = tree_source(storage, follow=True, notice=notices.append)
    assert ids(records(src)) == ["msg_01"]  # msg_02 is half written: nothing after it yet
    assert any("msg_02 is not valid JSON" in n for n in notices)
    (storage / "message" / "ses_1" / "msg_02.json").write_text(whole)
    assert ids(records(src)) == ["msg_02", "msg_03"]  # msg_04's part is half written
    part.write_text(part_text)
    assert ids(records(src)) == ["msg_04"]
    assert list(src.lines()) == []


def test_a_message_not_final_waits_and_a_user_message_waits_for_a_later_one(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    fresh_session(storage)
    message_file(storage, user("msg_01", 1))
    src = tree_source(storage, follow=True)
    assert records(src) == []
    message_file(storage, reply("msg_02", 2, done=False))
    assert ids(records(src)) == ["msg_01"]
    message_file(storage, reply("msg_02", 2))  # OpenCode rewrote it with time.completed
    assert ids(records(src)) == ["msg_02"]


def test_messages_of_the_first_format_are_passed_over_and_inline_parts_are_read(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    fresh_session(storage)
    message_file(storage, user("msg_01", 1))
    v1 = {"id": "msg_02", "role": "assistant", "metadata": {"sessionID": "ses_1"}, "parts": []}
    (storage / "message" / "ses_1" / "msg_02.json").write_text(json.dumps(v1))
    inline = reply("msg_03", 3)
    inline["data"]["parts"] = [{"id": "0", "type": "text", "text": "inline reply", "messageID": "msg_03"}]
    message_file(storage, inline, parts=False)
    message_file(storage, user("msg_04", 4))
    notices: list[str] = []
    got = records(tree_source(storage, notice=notices.append))
    assert ids(got) == ["msg_01", "msg_03"]
    assert got[1][1]["parts"] == [{"id": "0", "type": "text", "text": "inline reply"}]
    assert any("first message format" in n for n in notices)


def test_a_first_layout_session_takes_its_folder_from_a_message_once_one_names_it(tmp_path: Path) -> None:
    storage = tmp_path / "project" / "work-oc" / "storage"
    fresh_session(storage, legacy=True)
    message_file(storage, user("msg_01", 1), legacy=True)
    message_file(storage, user("msg_02", 2), legacy=True)
    src = tree_source(tmp_path, follow=True)
    assert records(src) == []  # no message names the folder yet: a turn would have no project
    message_file(storage, reply("msg_03", 3), legacy=True)
    got = records(src)
    assert ids(got) == ["msg_01", "msg_02", "msg_03"]
    assert {r["session"]["directory"] for _, r in got} == {"/work/oc"}


# ---------------------------------------------------------------------------------------------- following


def test_following_reads_only_what_changed_and_a_deleted_message_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = write_tree(tmp_path / "storage", ROWS)
    age(storage)  # written long ago: a folder or file read now is not read again unless it changes
    src = tree_source(storage, follow=True)
    assert len(records(src)) == 9
    reads: list[str] = []
    real = opencode_tree._read_json
    monkeypatch.setattr(opencode_tree, "_read_json", lambda p: reads.append(p) or real(p))
    listed: list[str] = []
    real_names = opencode_tree._names
    monkeypatch.setattr(opencode_tree, "_names", lambda p: listed.append(p) or real_names(p))
    assert list(src.lines()) == []
    # nothing changed: no folder listed, no file read (ses_2's message waits for a later one: stat'ed only)
    assert (reads, listed) == ([], [])
    message_file(storage, user("msg_20", 60))
    message_file(storage, reply("msg_21", 61))
    assert ids(records(src)) == ["msg_20", "msg_21"]
    assert reads and all("ses_1" in p or "msg_2" in p for p in reads)
    for mid in ("msg_20", "msg_21"):
        (storage / "message" / "ses_1" / f"{mid}.json").unlink()
    got = records(src)
    assert [r["removed"] for _, r in got] == [["msg_20", "msg_21"]]


def test_a_change_within_the_same_clock_tick_is_read_at_the_next_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(opencode_tree, "FRESH_S", 3600.0)  # every file counts as just written
    storage = tmp_path / "storage"
    fresh_session(storage)
    message_file(storage, user("msg_01", 1))
    path = message_file(storage, reply("msg_02", 2, done=False))
    done = json.dumps({"id": "msg_02", "sessionID": "ses_1", **reply("msg_02", 2)["data"]})
    path.write_text(path.read_text().ljust(len(done)))  # the same size as the final version
    src = tree_source(storage, follow=True)
    assert ids(records(src)) == ["msg_01"]
    stat = path.stat()
    path.write_text(done)  # rewritten in place within the same clock tick: same inode, size and time
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_ino == stat.st_ino
    assert ids(records(src)) == ["msg_02"]


def test_a_resume_skips_the_records_acknowledged(tmp_path: Path) -> None:
    import hashlib

    from throughline.producers.ingest.state import FileId, IngestState

    storage = write_tree(tmp_path / "storage", ROWS)
    lines = list(tree_source(storage).lines())
    file = FileId.of(os.stat(storage / "message" / "ses_1"))
    saved = IngestState(file, 3, 3, 2, hashlib.sha256(lines[2].data).digest())
    src = tree_source(storage, states={lines[2].path: saved})
    list(src.lines())
    assert src.tracked[lines[2].path].skip_to == 3


# ---------------------------------------------------------------------------------------------- property


@st.composite
def sessions(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A session's messages, ids ascending in time as OpenCode makes them."""
    out = []
    for i in range(draw(st.integers(1, 12))):
        mid = f"msg_{i:02d}"
        role = draw(st.sampled_from(["user", "assistant", "assistant"]))
        if role == "user":
            text = draw(st.sampled_from(["Fix it.", "Explain.", ""]))
            out.append(user(mid, i, text))
            continue
        m = reply(mid, i, draw(st.sampled_from(["Done.", ""])), done=draw(st.booleans()))
        finish = draw(st.sampled_from(["stop", "tool-calls", "error"]))
        if "completed" in m["data"]["time"]:
            if finish == "error":
                del m["data"]["finish"]
                m["data"]["error"] = {"name": "MessageAbortedError", "data": {}}
            else:
                m["data"]["finish"] = finish
        out.append(m)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sessions())
def test_the_tree_and_the_store_give_the_same_turns_for_the_same_session(
    tmp_path_factory: pytest.TempPathFactory, messages: list[dict[str, Any]]
) -> None:
    tmp = tmp_path_factory.mktemp("same")
    storage = tmp / "storage"
    fresh_session(storage)
    conn = open_store(tmp / "opencode.db")
    add_session(conn, {"id": "ses_1", "directory": "/work/oc", "parent_id": None, "title": "t", "created": BASE})
    for m in messages:
        message_file(storage, m)
        add_message(conn, m)
    conn.close()
    from_tree = [line.data for line in tree_source(storage).lines()]
    store = OpenCodeSource(HOST, [str(tmp / "opencode.db")])
    from_store = [line.data for line in store.lines()]
    store.close()
    assert from_tree == from_store
    name = "x#ses_1"
    assert [turn_key(t) for t in parse_records(HOST, name, from_tree, settle=False)] == [
        turn_key(t) for t in parse_records(HOST, name, from_store, settle=False)
    ]
