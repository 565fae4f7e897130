"""OpenCode's store as a line source: read-only and never in the writer's way, polled by watermark (only
the sessions that changed are read again), final messages only, deletions as ``removed`` records, and a
resume that checks the saved record before skipping anything."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
from support.opencode_store import add_message, build_store, open_store

from throughline.producers.hosts.opencode_db import OpenCodeSource, connect_read_only
from throughline.producers.hosts.registry import adapter
from throughline.producers.ingest.state import FileId, IngestState

ROWS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "adapters" / "opencode" / "rows.json"
BASE = 1777629600000


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return build_store(tmp_path / "opencode.db", ROWS)


def source(store: Path, **options: object) -> OpenCodeSource:
    return OpenCodeSource(adapter("opencode"), [str(store)], **options)  # type: ignore[arg-type]


def message(mid: str, second: int, role: str = "user", **data: object) -> dict:
    body = {"role": role, "time": {"created": BASE + second * 1000}, **data}
    return {
        "id": mid,
        "session": "ses_1",
        "created": BASE + second * 1000,
        "data": body,
        "parts": [{"id": f"p{mid}", "data": {"type": "text", "text": f"text of {mid}"}}],
    }


def test_the_reader_cannot_write_and_does_not_block_a_writer_mid_transaction(store: Path) -> None:
    conn = connect_read_only(str(store))
    with pytest.raises(sqlite3.OperationalError):
        conn.execute("DELETE FROM message")
    writer = open_store(store)
    writer.execute("BEGIN IMMEDIATE")  # OpenCode holds the write lock while it streams a message
    writer.execute("DELETE FROM part")
    src = source(store)
    # read while the writer holds its lock: the committed rows (ses_1's nine final messages)
    assert len(list(src.lines())) == 9
    writer.execute("ROLLBACK")
    writer.close()
    src.close()
    conn.close()


def test_a_following_poll_reads_only_the_sessions_that_changed(store: Path) -> None:
    src = source(store, follow=True)
    first = list(src.lines())
    assert {line.path.rpartition("#")[2] for line in first} == {"ses_1"}  # ses_2's one message is not final
    statements: list[str] = []
    next(iter(src._stores.values())).conn.set_trace_callback(statements.append)
    assert list(src.lines()) == []  # nothing changed: nothing read
    reads = [s for s in statements if "FROM message WHERE session_id" in s]
    assert reads == []
    writer = open_store(store)
    add_message(writer, message("msg_20", 60), updated=BASE + 60_000)
    add_message(
        writer,
        message(
            "msg_21",
            61,
            "assistant",
            finish="stop",
            time={"created": BASE + 61_000, "completed": BASE + 62_000},
        ),
        updated=BASE + 62_000,
    )
    statements.clear()
    new = list(src.lines())
    assert [(line.path.rpartition("#")[2], line.number) for line in new] == [("ses_1", 10), ("ses_1", 11)]
    reads = [s for s in statements if "FROM message WHERE session_id" in s]
    assert reads and all("'ses_1'" in s for s in reads)  # ses_2 did not change: not read again
    writer.close()
    src.close()


def test_a_message_still_streaming_holds_back_every_later_one(store: Path) -> None:
    writer = open_store(store)
    add_message(writer, message("msg_20", 60))
    add_message(writer, message("msg_21", 61, "assistant"))  # no time.completed yet
    writer.close()
    src = source(store)
    ids = [json.loads(line.data).get("message", {}).get("id") for line in src.lines() if line.path.endswith("#ses_1")]
    assert ids[-2:] == ["msg_09", "msg_20"]  # msg_20 is final (a later message exists), msg_21 is not
    src.close()


def test_rows_deleted_after_they_were_presented_become_a_removed_record(store: Path) -> None:
    src = source(store, follow=True)
    list(src.lines())
    writer = open_store(store)
    writer.execute("DELETE FROM message WHERE id IN ('msg_08', 'msg_09')")
    writer.execute("UPDATE session SET time_updated = ? WHERE id = 'ses_1'", (BASE + 99_000,))
    writer.close()
    records = [json.loads(line.data) for line in src.lines()]
    assert [r.get("removed") for r in records] == [["msg_08", "msg_09"]]
    src.close()


def test_a_resume_skips_only_when_the_saved_record_is_still_there(store: Path) -> None:
    lines = [line for line in source(store).lines() if line.path.endswith("#ses_1")]
    third = lines[2]
    file = FileId.of(store.stat())
    good = IngestState(file, 3, 3, 2, hashlib.sha256(third.data).digest())
    src = source(store, states={third.path: good})
    list(src.lines())
    assert src.tracked[third.path].skip_to == 3
    notices: list[str] = []
    bad = IngestState(file, 3, 3, 2, hashlib.sha256(b"something else").digest())
    src = source(store, states={third.path: bad}, notice=notices.append)
    list(src.lines())
    assert src.tracked[third.path].skip_to == 0 and "sending its turns again" in notices[0]


def test_a_missing_store_is_a_typed_error_unless_following(tmp_path: Path) -> None:
    from throughline.errors import InputError

    with pytest.raises(InputError) as caught:
        source(tmp_path / "nowhere" / "opencode.db")
    assert caught.value.code == "file_not_found"
    assert list(source(tmp_path / "nowhere", follow=True).lines()) == []
