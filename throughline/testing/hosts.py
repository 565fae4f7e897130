"""The conformance kit of host adapters: ``HostAdapterContract``, the tests every ``HostAdapter`` must pass.

An adapter's own test suite subclasses it, names its fixtures and runs with pytest::

    from throughline.testing.hosts import HostAdapterContract

    class TestFooHost(HostAdapterContract):
        def adapter(self):
            return FooHost()

        def sessions(self):
            return [str(FIXTURES / "session-1.jsonl")]

        def injected_texts(self):
            return ["<context injected by foo>"]   # text in the fixtures that is no human prompt

        def expected_turns(self, session):
            return [("t-1", 1, "answered"), ("t-2", 2, "interrupted")]

The checks: the adapter is well formed (name, ``reads``, roots, hook); parsing is deterministic; the
prefix property (the turns of any prefix of a session are the first turns of the whole session, so a hook
that stops early and a follower that reads on agree), and at the points where the host's stop hook runs
a hook that ``settle``s and a follower send the same turns; ``settle`` is final (a second call adds nothing); a
record that is not JSON is a typed error and loses no turn; every turn has a thread, a project, a
completedAt and a valid ``turn.outcome``; bodies are rendered within ``MAX_BODY_BYTES`` (an oversized
turn, when the suite writes one, is cut and says so); injected
context never becomes a prompt; rewinds, where the fixtures hold one, rewind seq; and the turns expected.

A session's records are its file's lines by default (``records``); a host that reads rows overrides
``records`` to give the records its source presents.
"""

from __future__ import annotations

import abc
import json
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

from throughline.core.turn import MAX_BODY_BYTES
from throughline.errors import InputError
from throughline.producers.hosts.adapter import HostAdapter
from throughline.producers.hosts.records import encode_record
from throughline.producers.hosts.render import OUTCOME_ATTRIBUTE, HostTurn

__all__ = ["OUTCOMES", "HostAdapterContract", "parse_records", "turn_key"]

#: Every value ``turn.outcome`` may take.
OUTCOMES = ("answered", "interrupted", "aborted")
_NAME = re.compile(r"^[a-z][a-z0-9-]*$")


def turn_key(t: HostTurn) -> tuple[object, ...]:
    """What a turn is, apart from the record that completed it (its line number)."""
    attributes = {k: v for k, v in t.attributes.items() if k != "ingest.line"}
    return (
        t.host,
        t.thread,
        t.project,
        t.turn_id,
        t.seq,
        t.completed_at_micros,
        t.body,
        sorted(attributes.items()),
    )


def parse_records(
    adapter: HostAdapter, session: str, records: Sequence[bytes], *, settle: bool = True, final: bool = False
) -> list[HostTurn]:
    """The turns a fresh parser gives for ``records`` (record N is line N), then ``settle`` when asked
    (``final``: as a stop hook's call settles)."""
    parser = adapter.new_parser(session)
    turns: list[HostTurn] = []
    for number, data in enumerate(records, 1):
        try:
            turns.extend(parser.feed(number, data))
        except InputError:
            continue
    if settle:
        turns.extend(parser.settle(final=final))
    return turns


class HostAdapterContract(abc.ABC):
    """Tests every host adapter must pass (subclass it as ``Test...`` in the adapter's suite)."""

    # ------------------------------------------------------------------------------- what a suite gives

    @abc.abstractmethod
    def adapter(self) -> HostAdapter:
        """The adapter under test."""

    @abc.abstractmethod
    def sessions(self) -> list[str]:
        """The fixture sessions (the names ``new_parser`` is given): at least one, with at least one turn."""

    def records(self, session: str) -> list[bytes]:
        """The records of a session in order (default: the file's lines, or a whole document's records)."""
        adapter = self.adapter()
        if adapter.has_documents and adapter.is_document(session):
            document = json.loads(Path(session).read_bytes())
            return [encode_record(r) for r in adapter.document_records(document)]
        return Path(session).read_bytes().splitlines()

    def injected_texts(self) -> list[str]:
        """Text the fixtures hold that the host injected (context, notifications): never in a prompt."""
        return []

    def expected_turns(self, session: str) -> list[tuple[str, int, str]] | None:
        """(turnId, seq, outcome) of the session's turns in order, settle included (``None``: not checked)."""
        return None

    def has_rewinds(self) -> bool:
        """Whether a fixture holds a rewind (then some turn's seq must not be past its thread's tip)."""
        return False

    def oversized_session(self, folder: Path) -> str | None:
        """A session written into ``folder`` whose turn renders over ``MAX_BODY_BYTES`` (a reply or prompt
        of a megabyte or more; ``None``: not checked). Its body must be cut to the limit and say so."""
        return None

    def hook_points(self, session: str) -> list[int]:
        """How many records the session held each time the host's stop hook would have run (none: not checked).

        At each, a hook reads that many records and ``settle()``s: it must send what a follower that reads
        the whole session sends, or a turn a later turn of the whole session supersedes (a rewind).
        """
        return []

    # ---------------------------------------------------------------------------------------- helpers

    def turns(self, session: str, *, settle: bool = True) -> list[HostTurn]:
        """The turns of a whole session."""
        return parse_records(self.adapter(), session, self.records(session), settle=settle)

    # ------------------------------------------------------------------------------------------ tests

    def test_the_adapter_is_well_formed(self) -> None:
        adapter = self.adapter()
        assert isinstance(adapter, HostAdapter)
        assert _NAME.match(adapter.name), f"format name {adapter.name!r}: lower case letters, digits and -"
        assert adapter.reads in ("lines", "rows")
        assert adapter.hook_event is None or (isinstance(adapter.hook_event, str) and adapter.hook_event)
        roots = adapter.default_roots({})
        assert roots and all(isinstance(r, str) and r for r in roots)
        assert self.sessions(), "the suite names no fixture session"

    def test_every_fixture_gives_turns_with_a_valid_outcome(self) -> None:
        total = 0
        for session in self.sessions():
            for t in self.turns(session):
                total += 1
                assert t.host == self.adapter().name
                assert t.thread and t.project and t.turn_id, t
                assert t.seq >= 1 and t.completed_at_micros > 0, t
                assert t.attributes.get(OUTCOME_ATTRIBUTE) in OUTCOMES, t.attributes
        assert total > 0, "no fixture gave a turn"

    def test_parsing_is_deterministic(self) -> None:
        for session in self.sessions():
            assert self.turns(session) == self.turns(session)

    def test_the_turns_of_every_prefix_are_the_first_turns_of_the_whole(self) -> None:
        adapter = self.adapter()
        for session in self.sessions():
            records = self.records(session)
            whole = [turn_key(t) for t in parse_records(adapter, session, records, settle=False)]
            for cut in range(len(records) + 1):
                prefix = [turn_key(t) for t in parse_records(adapter, session, records[:cut], settle=False)]
                assert prefix == whole[: len(prefix)], f"{session}: the first {cut} records"
            settled = [turn_key(t) for t in self.turns(session)]
            assert settled[: len(whole)] == whole  # settle only adds the open turn, at the end

    def test_a_hook_and_a_follower_agree(self) -> None:
        adapter = self.adapter()
        for session in self.sessions():
            records = self.records(session)
            whole = self.turns(session)
            by_id = {t.turn_id: turn_key(t) for t in whole}
            for point in self.hook_points(session):
                for t in parse_records(adapter, session, records[:point], final=True):
                    if t.turn_id in by_id:
                        assert turn_key(t) == by_id[t.turn_id], (
                            f"{session}: the hook at record {point}, turn {t.turn_id}"
                        )
                        continue
                    # a turn the whole session takes back: a later turn takes its place in the chain
                    assert any(
                        (w.thread, w.project) == (t.thread, t.project) and w.seq <= t.seq and w.line > point
                        for w in whole
                    ), f"{session}: the hook at record {point} sent {t.turn_id}, which nothing supersedes"

    def test_settle_is_final(self) -> None:
        adapter = self.adapter()
        for session in self.sessions():
            parser = adapter.new_parser(session)
            for number, data in enumerate(self.records(session), 1):
                try:
                    parser.feed(number, data)
                except InputError:
                    pass
            parser.settle()
            assert parser.settle() == [], "a second settle() completed a turn again"
            assert parser.settle(final=True) == [], "a final settle() after a settle() completed a turn again"

    def test_a_record_that_is_not_json_is_a_typed_error_and_loses_nothing(self) -> None:
        adapter = self.adapter()
        for session in self.sessions():
            records = self.records(session)
            parser = adapter.new_parser(session)
            try:
                parser.feed(1, b"{not json")
            except InputError as exc:
                assert exc.code, "a typed error carries its code"
            else:
                raise AssertionError("a record that is not JSON was accepted")
            damaged = [b"{not json", *records]
            clean = [turn_key(t) for t in self.turns(session)]
            assert [turn_key(t) for t in parse_records(adapter, session, damaged)] == clean

    def test_bodies_are_rendered_within_the_limit(self) -> None:
        for session in self.sessions():
            for t in self.turns(session):
                size = len(t.body.encode("utf-8"))
                assert size <= MAX_BODY_BYTES
                assert t.body.startswith("## Prompt\n\n") and "\n\n## Reply\n\n" in t.body
                if t.attributes.get("ingest.bodyTruncated") == "true":
                    assert int(t.attributes["ingest.bodyBytes"]) > MAX_BODY_BYTES

    def test_an_oversized_turn_is_cut_to_the_limit_and_says_so(self) -> None:
        with tempfile.TemporaryDirectory(prefix="oversized-") as folder:
            session = self.oversized_session(Path(folder))
            if session is None:
                return
            turns = self.turns(session)
            assert turns, "the oversized session gave no turn"
            assert all(len(t.body.encode("utf-8")) <= MAX_BODY_BYTES for t in turns)
            assert any(t.attributes.get("ingest.bodyTruncated") == "true" for t in turns)

    def test_injected_context_is_never_a_prompt(self) -> None:
        texts = self.injected_texts()
        for session in self.sessions():
            for t in self.turns(session):
                prompt = t.body.split("\n\n## ", 1)[0]
                for text in texts:
                    assert text not in prompt, f"turn {t.turn_id}: injected {text!r} became its prompt"

    def test_rewinds_rewind_seq(self) -> None:
        if not self.has_rewinds():
            return
        rewound = False
        for session in self.sessions():
            tips: dict[tuple[str, str], int] = {}
            for t in self.turns(session):
                tip = tips.get((t.thread, t.project), 0)
                assert t.seq <= tip + 1, f"turn {t.turn_id} skips past the chain's tip"
                rewound = rewound or t.seq <= tip
                tips[(t.thread, t.project)] = t.seq
        assert rewound, "has_rewinds() says a fixture rewinds, and no turn's seq went back"

    def test_the_expected_turns(self) -> None:
        for session in self.sessions():
            expected = self.expected_turns(session)
            if expected is not None:
                got = [(t.turn_id, t.seq, t.attributes.get(OUTCOME_ATTRIBUTE)) for t in self.turns(session)]
                assert got == [tuple(e) for e in expected]
