"""Host transcripts the hosts really wrote (tests/fixtures/hosts/real/), read as a person reads them.

Each file in ``expected.json`` is fed line by line to the host's parser as ingest feeds it (a line that
is no JSON object is skipped and reading goes on), then ``settle()`` says the file is final. The turns
must be the ones a person reading the conversation names: their count, seq and outcome
(``turn.outcome``: answered, interrupted or aborted), the start of the rendered prompt (whitespace as in
the file) and the start of the rendered reply (leading whitespace left out: a reply's leading blank
lines say nothing to a reader; an empty expectation means the reply is empty or whitespace only).

SOURCES.md beside the files says where each real file comes from and which shapes it shows; the
``shape-*`` files are minimal ones written here for shapes seen only in files that may not be copied.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from throughline.producers.exceptions import TranscriptLineError
from throughline.producers.hosts import HostTurn, new_parser

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "real"
EXPECTED: dict[str, dict[str, Any]] = json.loads((REAL / "expected.json").read_text(encoding="utf-8"))
PROMPT_HEAD = "## Prompt\n\n"
REPLY_HEAD = "\n\n## Reply\n\n"


def lines_of(rel: str) -> list[bytes]:
    """The file's complete lines (a final line without its newline is not written yet, so not read)."""
    return (REAL / rel).read_bytes().split(b"\n")[:-1]


def feed(fmt: str, rel: str, lines: list[bytes], *, settle: bool) -> list[HostTurn]:
    """The turns a fresh parser returns for ``lines`` (numbered from 1), then for ``settle()`` if asked."""
    parser = new_parser(fmt, str(REAL / rel))
    out: list[HostTurn] = []
    for number, raw in enumerate(lines, 1):
        try:
            out.extend(parser.feed(number, raw))
        except TranscriptLineError:
            pass  # ingest reports the line and reads on
    if settle:
        out.extend(parser.settle())
    return out


def sections(body: str, prompt_start: str) -> tuple[str, str]:
    """The body's prompt section and reply section (render.py's layout)."""
    assert body.startswith(PROMPT_HEAD), f"body does not start with {PROMPT_HEAD!r}: {body[:80]!r}"
    rest = body[len(PROMPT_HEAD) :]
    # the reply heading is looked for after the expected prompt, so that a prompt quoting it is no reply
    at = rest.find(REPLY_HEAD, len(prompt_start) if rest.startswith(prompt_start) else 0)
    assert at >= 0, f"no reply section in body {body[:120]!r}"
    prompt_and_tools = rest[:at]
    return prompt_and_tools, rest[at + len(REPLY_HEAD) :]


def differences(turns: list[HostTurn], expected: list[dict[str, Any]]) -> list[str]:
    """Every way ``turns`` differ from the expectation, first difference first (one line each)."""
    out: list[str] = []
    for i, (turn, want) in enumerate(zip(turns, expected, strict=False), 1):
        where = f"turn {i} (line {turn.line})"
        if turn.seq != want["seq"]:
            out.append(f"{where}: seq {turn.seq}, expected {want['seq']}")
        outcome = turn.attributes.get("turn.outcome")
        if outcome != want["outcome"]:
            out.append(f"{where}: outcome {outcome!r}, expected {want['outcome']!r}")
        prompt, reply = sections(turn.body, want["promptStartsWith"])
        if not prompt.startswith(want["promptStartsWith"]):
            out.append(f"{where}: prompt starts {prompt[:60]!r}, expected {want['promptStartsWith']!r}")
        reply = reply.lstrip()
        if want["replyStartsWith"] == "" and reply.strip():
            out.append(f"{where}: reply {reply[:60]!r}, expected an empty reply")
        elif not reply.startswith(want["replyStartsWith"]):
            out.append(f"{where}: reply starts {reply[:60]!r}, expected {want['replyStartsWith']!r}")
    if len(turns) != len(expected):
        extra = [f"seq {t.seq} line {t.line} {t.body[len(PROMPT_HEAD) :][:40]!r}" for t in turns[len(expected) :]]
        missing = [f"seq {w['seq']} {w['promptStartsWith'][:40]!r}" for w in expected[len(turns) :]]
        out.insert(0, f"{len(turns)} turns, expected {len(expected)}; extra {extra}, missing {missing}")
    return out


@pytest.mark.parametrize("rel", sorted(EXPECTED))
def test_turns_are_the_ones_a_reader_names(rel: str) -> None:
    spec = EXPECTED[rel]
    turns = feed(spec["format"], rel, lines_of(rel), settle=True)
    found = differences(turns, spec["turns"])
    assert not found, found[0] + (f" (and {len(found) - 1} more)" if len(found) > 1 else "")


@pytest.mark.parametrize("rel", sorted(rel for rel, spec in EXPECTED.items() if spec["real"]))
def test_every_prefix_yields_the_first_turns_of_the_file(rel: str) -> None:
    """A reader stopping at any line boundary (a hook, a follower) appends the whole file's first turns."""
    spec = EXPECTED[rel]
    lines = lines_of(rel)
    whole = feed(spec["format"], rel, lines, settle=False)
    for cut in range(len(lines) + 1):
        head = feed(spec["format"], rel, lines[:cut], settle=False)
        assert head == whole[: len(head)], f"the first {cut} lines yield turns that are not the file's first turns"


def test_the_corpus_is_what_sources_md_lists() -> None:
    """Every file is in expected.json and in SOURCES.md, and real files are never ours."""
    files = {str(p.relative_to(REAL)) for p in REAL.glob("*/*.jsonl")}
    assert files == set(EXPECTED)
    sources = (REAL / "SOURCES.md").read_text(encoding="utf-8")
    for rel, spec in EXPECTED.items():
        assert f"`{rel}`" in sources, f"{rel} is not in SOURCES.md"
        assert spec["real"] == (not Path(rel).name.startswith("shape-")), rel
    assert sum(spec["real"] for spec in EXPECTED.values()) >= 25
