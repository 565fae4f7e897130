"""The reader against the real broker and the real projector, through the ``throughline`` CLI."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from reader_env import Env
from support.cursor import cursor_length
from support.wire import READ_FIELDS

from throughline.core.identity import project_sha256
from throughline.core.page_token import SeriesBinding, issue_page_token
from throughline.reader import KEY_FILE_NAME, ObserverRead
from throughline.reader.token_key import read_key_file


@pytest.fixture
def env(kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    return Env.isolated(kafka_bootstrap, kafka_topic_name, tmp_path, monkeypatch)


def _seqs(pages: list[ObserverRead]) -> list[int]:
    return [t.seq for p in pages for t in p.turns]


def test_a_series_never_shows_turns_completed_during_it(env: Env) -> None:
    env.ingest_n(2)
    env.project_log()
    first, _ = env.read()
    after = first.throughCursor
    assert cursor_length(after) == 2
    lines = env.ingest_n(10)
    env.project_log()

    pages = [env.read(after=after, limit=3)[0]]
    through = pages[0].throughCursor
    assert cursor_length(through) == 12
    while not pages[-1].page.complete:
        env.ingest_n(4)  # completes mid-series, and the projector applies it
        env.project_log()
        pages.append(env.read(after=after, through=through, token=pages[-1].page.nextToken, limit=3)[0])
        assert len(pages) <= 5
    assert len(pages) == 4
    assert _seqs(pages) == list(range(3, 13))
    assert [t.body for p in pages for t in p.turns] == [line["body"] for line in lines]
    assert all(p.throughCursor == through and p.status == "ok" for p in pages)

    # The next series collects what completed meanwhile, without gap or duplicate.
    nxt = [env.read(after=through, limit=100)[0]]
    assert _seqs(nxt) == list(range(13, 25)) and nxt[0].page.complete


def test_rollback_under_the_after_cursor_is_resync_required(env: Env) -> None:
    env.ingest_n(6)
    env.project_log()
    after = env.read()[0].throughCursor
    env.ingest([env.turn(seq=4)])  # the host rewinds the thread to seq 4
    env.project_log()
    read, text = env.read(after=after)
    assert read.status == "resync_required" and read.turns == () and read.page.nextToken is None
    assert read.afterCursor == after
    # A fresh snapshot is fine, and names the rewound chain.
    fresh = env.read()[0]
    assert fresh.status == "ok" and cursor_length(fresh.throughCursor) == 4


def test_a_thread_switch_reads_the_new_thread_from_zero(env: Env) -> None:
    env.ingest_n(5)
    env.project_log()
    after = env.read()[0].throughCursor
    new = env.ingest_n(4, thread="thread-secret-B")
    env.project_log()
    pages = [env.read(after=after, limit=3)[0]]
    pages.append(env.read(after=after, through=pages[0].throughCursor, token=pages[0].page.nextToken, limit=3)[0])
    assert pages[-1].page.complete
    assert _seqs(pages) == [1, 2, 3, 4]
    assert [t.body for p in pages for t in p.turns] == [line["body"] for line in new]
    assert pages[0].thread != env.read(through=after)[0].thread


def test_ingest_without_projecting_is_pending_then_ok(env: Env) -> None:
    env.ingest_n(3)
    env.project_log()
    assert env.read()[0].status == "ok"
    env.ingest_n(2)  # on the log, not in the projection
    read, text = env.read()
    assert read.status == "projection_pending"
    assert read.turns == () and read.throughCursor is None and read.page.nextToken is None
    assert set(json.loads(text)) == READ_FIELDS
    env.project_log()
    ok = env.read()[0]
    assert ok.status == "ok" and _seqs([ok]) == [1, 2, 3, 4, 5]


def test_hard_input_errors_exit_2_with_stable_codes(env: Env) -> None:
    env.ingest_n(2)
    env.project_log()
    after = env.read()[0].throughCursor
    assert after is not None
    env.ingest_n(12)
    env.project_log()
    page = env.read(after=after, limit=5)[0]
    through, token = page.throughCursor, page.page.nextToken
    assert through is not None and token is not None
    other_after = env.read(through=through, limit=1)[0].throughCursor  # == through, a valid cursor
    key = read_key_file(env.db.parent / KEY_FILE_NAME)
    binding = SeriesBinding.of(project_sha256(env.project), after, through)
    flipped = token[:20] + ("A" if token[20] != "A" else "B") + token[21:]

    cases = {
        "invalid_limit": ["--limit", "abc"],
        "invalid_cursor": ["--after", "tlc1.nonsense"],
        "page_token_unbound": ["--page-token", token],
        "page_token_mismatch": ["--after", str(other_after), "--through", through, "--page-token", token],
        "page_token_version": ["--after", after, "--through", through, "--page-token", "tlp2." + token[5:]],
        "page_token_tampered": ["--after", after, "--through", through, "--page-token", flipped],
        "page_token_oversize": ["--after", after, "--through", through, "--page-token", "tlp1." + "A" * 4100],
        "page_token_offset": [
            "--after",
            after,
            "--through",
            through,
            "--page-token",
            issue_page_token(key, binding, 12),
        ],
        "invalid_project": [],
    }
    for code, argv in cases.items():
        if code == "invalid_project":
            exit_code, got = _read_other_project(env, "")
        else:
            exit_code, got = env.read_error(*argv)
        assert (exit_code, got) == (2, code), code
    # The console script in a real process: exit 2, one JSON error document on stderr, nothing on stdout.
    done = env.process("read", "--project", env.project, *env.connection, "--after", "tlc1.x")
    assert done.returncode == 2 and done.stdout == ""
    assert json.loads(done.stderr.strip().splitlines()[-1])["error"]["code"] == "invalid_cursor"
    # The same token for another project is a mismatch too, never resync_required.
    exit_code, got = _read_other_project(
        env, "/srv/another", "--after", after, "--through", through, "--page-token", token
    )
    assert (exit_code, got) == (2, "page_token_mismatch")


def _read_other_project(env: Env, project: str, *argv: str) -> tuple[int, str]:
    code, out, err = env.cli("read", "--project", project, *env.connection, "--wait", "0", *argv)
    return code, json.loads(err.strip().splitlines()[-1])["error"]["code"]


def test_nothing_raw_leaks_into_tokens_cursors_or_documents(env: Env) -> None:
    raw = [
        env.project,
        "secret-workspace",
        "ledger",
        "host-secret",
        "thread-secret",
        "turnid-secret",
    ]
    env.ingest_n(3)
    env.ingest_n(8, thread="thread-secret-B")
    env.project_log()
    documents: list[str] = []
    snapshot, text = env.read(limit=2)
    documents.append(text)
    asked = {t.body for t in snapshot.turns}
    after = snapshot.throughCursor
    env.ingest_n(7)
    env.project_log()
    pages = [env.read(after=after, limit=3)]
    while not pages[-1][0].page.complete:
        prev = pages[-1][0]
        pages.append(env.read(after=after, through=prev.throughCursor, token=prev.page.nextToken, limit=3))
        assert len(pages) < 10
    documents += [text for _, text in pages]
    asked |= {t.body for p, _ in pages for t in p.turns}
    env.ingest_n(1, thread="thread-secret-C")
    documents.append(env.read()[1])  # pending: nothing projected for it yet

    strings = list(documents)
    for doc in documents:
        parsed = json.loads(doc)
        for value in (parsed["afterCursor"], parsed["throughCursor"], parsed["page"]["nextToken"]):
            if value:
                strings.append(value)
                payload = value.split(".")[1]
                strings.append(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode("latin-1"))
    all_bodies = {f"body-secret-{i} ✓" for i in range(1, env.counter + 1)}
    for text in strings:
        for word in raw:
            assert word not in text
        for body in all_bodies - asked:
            assert body not in text
    assert asked  # the scan saw served bodies, and only those
