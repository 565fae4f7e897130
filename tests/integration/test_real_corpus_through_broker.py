"""The real transcript corpus (tests/fixtures/hosts/real/) through the real console script and broker.

- ``ingest --dry-run --settle 0`` prints exactly the turns the parsers give for each file, and ingesting
  the same files for real then projecting them holds exactly those turns (live or superseded), with
  nothing quarantined and no source broken (a file and a byte prefix of it, both in the corpus, send
  the same records: a duplicate applied once, never a conflict).
- ``throughline hook claude-code``, called as the host calls it (after each turn is written, before the
  host writes its ``stop_hook_summary``), on every real file that has such lines: each call delivers
  exactly the turns finished by then, nothing late and nothing twice.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from support.topic import read_topic
from test_hosts import cli

from throughline.core.chain import content_digest
from throughline.core.turn import parse_rfc3339
from throughline.producers.exceptions import TranscriptLineError
from throughline.producers.hosts import HostTurn, new_parser

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "real"
EXPECTED = json.loads((REAL / "expected.json").read_text(encoding="utf-8"))
FORMATS = ("claude-code", "codex")


def parsed(fmt: str, path: Path, lines: list[bytes] | None = None, *, settle: bool = True) -> list[HostTurn]:
    parser = new_parser(fmt, str(path))
    out: list[HostTurn] = []
    for number, raw in enumerate(path.read_bytes().split(b"\n")[:-1] if lines is None else lines, 1):
        try:
            out.extend(parser.feed(number, raw))
        except TranscriptLineError:
            pass
    return out + (parser.settle() if settle else [])


def corpus_files(fmt: str) -> list[str]:
    """The corpus files of a host, named one by one (a folder search takes only the host's own file names)."""
    return [str(REAL / rel) for rel, doc in sorted(EXPECTED.items()) if doc["format"] == fmt]


Key = tuple[str, str, str, int | None, bytes]  # host, thread, turnId, seq, content digest


def key_of(t: HostTurn) -> Key:
    return (t.host, t.thread, t.turn_id, t.seq, content_digest(t.turn_id, t.completed_at_micros, t.body))


def test_the_corpus_projects_exactly_what_its_dry_run_prints(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    printed: list[Key] = []
    want: list[Key] = []
    for fmt in FORMATS:
        files = corpus_files(fmt)
        dry = cli(kafka_bootstrap, kafka_topic_name, "ingest", "--format", fmt, *files, "--dry-run", "--settle", "0")
        assert dry.returncode == 0, dry.stderr
        for line in dry.stdout.splitlines():
            doc = json.loads(line)
            assert set(doc) == {"project", "host", "thread", "turnId", "seq", "completedAt", "body", "attributes"}
            assert doc["attributes"]["turn.outcome"] in ("answered", "interrupted", "aborted")
            micros = parse_rfc3339(doc["completedAt"])
            printed.append(
                (
                    doc["host"],
                    doc["thread"],
                    doc["turnId"],
                    doc["seq"],
                    content_digest(doc["turnId"], micros, doc["body"]),
                )
            )
        for path in files:
            want.extend(key_of(t) for t in parsed(fmt, Path(path)))
    assert printed == want  # the dry run is the parsers' output, file by file, in order
    counted = sum(len(v["turns"]) for v in EXPECTED.values())
    assert len(printed) == counted  # and so the expectation's count

    for fmt in FORMATS:
        sent = cli(kafka_bootstrap, kafka_topic_name, "ingest", "--format", fmt, *corpus_files(fmt), "--settle", "0")
        assert sent.returncode == 0, sent.stderr
    db = str(tmp_path / "corpus.duckdb")
    projected = cli(kafka_bootstrap, kafka_topic_name, "project", "--until-caught-up", "--db", db)
    assert projected.returncode == 0, projected.stderr
    with duckdb.connect(db, read_only=True) as con:
        rows = con.execute(
            "SELECT turn_id, seq, content_digest FROM turns UNION ALL "
            "SELECT turn_id, seq, content_digest FROM superseded_turns"
        ).fetchall()
        assert con.execute("SELECT count(*) FROM quarantine").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM sources WHERE broken_reason IS NOT NULL").fetchone() == (0,)
    stored = sorted((turn_id, seq, bytes(digest)) for turn_id, seq, digest in rows)
    assert stored == sorted({(k[2], k[3], k[4]) for k in printed})  # each distinct turn once


HOOKED = [
    rel
    for rel, doc in sorted(EXPECTED.items())
    if doc["format"] == "claude-code" and b'"subtype":"stop_hook_summary"' in (REAL / rel).read_bytes()
]


@pytest.mark.parametrize("rel", HOOKED)
def test_the_hook_at_each_stop_sends_exactly_the_turns_finished_by_then(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path, rel: str
) -> None:
    source = REAL / rel
    lines = source.read_bytes().split(b"\n")[:-1]
    stops = [i for i, raw in enumerate(lines) if b'"subtype":"stop_hook_summary"' in raw]
    full = parsed("claude-code", source, settle=False)
    transcript = tmp_path / source.name
    transcript.write_bytes(b"")
    written = 0
    hook = ["hook", "claude-code", "--state-dir", str(tmp_path / "hooks"), "--wait", "0.2"]
    for stop in stops:
        with open(transcript, "ab") as f:  # the host appends the turn's lines, then calls its Stop hook
            f.write(b"".join(raw + b"\n" for raw in lines[written:stop]))
        written = stop
        session = json.loads(lines[stop]).get("sessionId", "s")
        payload = json.dumps(
            {
                "session_id": session,
                "transcript_path": str(transcript),
                "cwd": "/",
                "hook_event_name": "Stop",
                "stop_hook_active": False,
            }
        )
        result = cli(kafka_bootstrap, kafka_topic_name, *hook, stdin=payload)
        assert (result.returncode, result.stdout) == (0, ""), result.stderr
        got = [
            (
                r.turn.host,
                r.turn.thread,
                r.turn.turn_id,
                r.turn.seq,
                content_digest(r.turn.turn_id, r.turn.completed_at_micros, r.turn.body),
            )
            for r in read_topic(kafka_bootstrap, kafka_topic_name)
        ]
        finished = [key_of(t) for t in full if t.line <= stop + 1]  # ended by this stop_hook_summary at the latest
        assert got == finished, f"after the hook at line {stop + 1}"
