"""How host turns end, on lines shaped as the hosts write them (the real files are in
tests/fixtures/hosts/real/, listed with their provenance in its SOURCES.md).

Each case is the smallest run of lines that shows one shape: Codex rollouts of the 0.40 era (no
``task_started``/``task_complete``), Claude Code 2.1.2xx messages written one block a line with
``end_turn`` on every block, Claude Code 2.0.x-2.1.39 (``stop_reason`` null, ``stop_hook_summary``),
host-injected prompts, interrupted and aborted turns, slash commands, images, whitespace-only blocks.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from throughline.core.turn import format_rfc3339
from throughline.producers.hosts import HostTurn
from throughline.producers.hosts.claude_code import ClaudeCodeSession
from throughline.producers.hosts.codex import CodexSession
from throughline.producers.hosts.lines import SessionParser


def feed(parser: SessionParser, entries: list[dict[str, Any]], *, settle: bool = False) -> list[HostTurn]:
    out: list[HostTurn] = []
    for n, entry in enumerate(entries, 1):
        out.extend(parser.feed(n, json.dumps(entry).encode()))
    return out + (parser.settle() if settle else [])


def reply(turn: HostTurn) -> str:
    return turn.body.split("## Reply\n\n", 1)[1]


def prompt(turn: HostTurn) -> str:
    return turn.body.split("## Prompt\n\n", 1)[1].split("\n\n## ", 1)[0]


def outcome(turn: HostTurn) -> str:
    return turn.attributes["turn.outcome"]


def at(turn: HostTurn) -> str:
    return format_rfc3339(turn.completed_at_micros)


# ------------------------------------------------------------------------------------------ Claude Code


class Claude:
    """Lines of one Claude Code session, each the child of the one before (as the host writes them)."""

    def __init__(self, version: str = "2.1.250") -> None:
        self.version = version
        self.lines: list[dict[str, Any]] = []
        self.n = 0

    def _line(self, kind: str, **extra: Any) -> dict[str, Any]:
        self.n += 1
        entry = {
            "parentUuid": self.lines[-1]["uuid"] if self.lines else None,
            "isSidechain": False,
            "userType": "external",
            "cwd": "/w",
            "sessionId": "S",
            "version": self.version,
            "type": kind,
            "uuid": f"u{self.n}",
            "timestamp": f"2026-02-01T10:00:{self.n:02d}.000Z",
            **extra,
        }
        self.lines.append(entry)
        return entry

    def user(self, content: Any, **extra: Any) -> dict[str, Any]:
        return self._line("user", message={"role": "user", "content": content}, **extra)

    def block(self, msg: str, block: dict[str, Any], stop: str | None, **extra: Any) -> dict[str, Any]:
        return self._line(
            "assistant",
            message={"id": msg, "type": "message", "role": "assistant", "content": [block], "stop_reason": stop},
            **extra,
        )

    def result(self, tool_id: str) -> dict[str, Any]:
        return self.user(
            [{"type": "tool_result", "tool_use_id": tool_id, "content": "ok"}], toolUseResult={"stdout": "ok"}
        )

    def system(self, subtype: str, **extra: Any) -> dict[str, Any]:
        return self._line("system", subtype=subtype, level="info", **extra)


THINK = {"type": "thinking", "thinking": "", "signature": "c2ln"}


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def tool(tool_id: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": "Bash", "input": {"command": "ls"}}


def test_a_thinking_block_line_with_end_turn_does_not_end_the_turn_before_its_text_line() -> None:
    c = Claude("2.1.250")
    c.user("What is in here?", promptId="p1")
    c.block("m1", THINK, "end_turn")
    c.block("m1", text("Two files."), "end_turn")
    c.system("stop_hook_summary", hookCount=1, hookInfos=[], hookErrors=[], preventedContinuation=False)
    c.system("turn_duration", durationMs=5000)
    (turn,) = feed(ClaudeCodeSession("S"), c.lines)
    assert reply(turn) == "Two files." and outcome(turn) == "answered"
    assert at(turn) == "2026-02-01T10:00:03.000000Z" and turn.line == 4  # the text line's time
    # the hook's view (the host calls it before it writes stop_hook_summary): the same turn, settled
    parser = ClaudeCodeSession("S")
    assert feed(parser, c.lines[:3]) == []
    (hooked,) = parser.settle()
    assert (hooked.body, hooked.completed_at_micros, hooked.turn_id) == (
        turn.body,
        turn.completed_at_micros,
        turn.turn_id,
    )


def test_older_hosts_without_stop_reason_end_a_turn_at_stop_hook_summary_and_the_last_turn_at_settle() -> None:
    c = Claude("2.0.77")
    c.user("Run the tests.", promptId="p1")
    c.block("m1", tool("t1"), None)
    c.result("t1")
    c.block("m2", text("All pass."), None)
    c.system("stop_hook_summary", hookCount=1, hookInfos=[], hookErrors=[], preventedContinuation=False)
    c.user("Now commit.", promptId="p2")
    c.block("m3", text("Committed."), None)
    parser = ClaudeCodeSession("S")
    first = feed(parser, c.lines)
    assert [t.turn_id for t in first] == ["p1"] and first[0].line == 5  # at stop_hook_summary, not the next prompt
    assert at(first[0]) == "2026-02-01T10:00:04.000000Z"  # the reply's time, as the hook would see it
    (last,) = parser.settle()  # a finished session: its last answered turn is a turn
    assert (last.turn_id, last.seq, reply(last), outcome(last)) == ("p2", 2, "Committed.", "answered")


def test_settle_leaves_a_turn_whose_tool_call_waits_or_whose_last_line_is_a_tool_result() -> None:
    c = Claude("2.0.77")
    c.user("Run the tests.", promptId="p1")
    c.block("m1", text("Running them."), None)
    c.block("m1", tool("t1"), None)
    parser = ClaudeCodeSession("S")
    assert feed(parser, c.lines, settle=True) == []  # the call waits for its result
    c.result("t1")
    parser = ClaudeCodeSession("S")
    assert feed(parser, c.lines, settle=True) == []  # the model has not answered the result yet


def test_injected_prompts_are_not_turns_by_wrapper_or_by_origin() -> None:
    c = Claude()
    c.user("Start the build in the background.", promptId="p1", origin={"kind": "human"})
    c.block("m1", text("Started."), "end_turn")
    c.user("<task-notification>\n<task-id>b1</task-id>\n<status>completed</status>\n</task-notification>")
    c.block("m2", text("The build finished."), "end_turn")
    c.user("3 background agents were stopped", origin={"kind": "task-notification"})
    c.block("m3", text("Noted."), "end_turn")
    c.user("Ship it.", promptId="p2")
    c.block("m4", text("Shipped."), "end_turn")
    turns = feed(ClaudeCodeSession("S"), c.lines, settle=True)
    assert [(t.turn_id, t.seq) for t in turns] == [("p1", 1), ("p2", 2)]


def test_an_interrupted_turn_is_a_turn_with_its_partial_reply_whether_or_not_a_prompt_follows() -> None:
    c = Claude()
    c.user("Refactor the module.", promptId="p1")
    c.block("m1", text("Starting with the imports"), None)
    c.block("m1", tool("t1"), None)
    c.user(
        [
            {
                "type": "tool_result",
                "tool_use_id": "t1",
                "is_error": True,
                "content": "The user doesn't want to proceed with this tool use.",
            }
        ],
        toolUseResult="Error",
    )
    c.user([text("[Request interrupted by user for tool use]")])
    (turn,) = feed(ClaudeCodeSession("S"), c.lines)  # the last line of the file: still a turn
    assert (outcome(turn), reply(turn), at(turn)) == (
        "interrupted",
        "Starting with the imports",
        "2026-02-01T10:00:05.000000Z",
    )
    c.user("Only rename it.", promptId="p2")
    c.block("m2", text("Renamed."), "end_turn")
    turns = feed(ClaudeCodeSession("S"), c.lines, settle=True)
    assert [(t.turn_id, t.seq, outcome(t)) for t in turns] == [("p1", 1, "interrupted"), ("p2", 2, "answered")]


def test_a_custom_slash_command_the_model_works_on_is_a_turn_and_a_built_in_one_is_not() -> None:
    c = Claude()
    c.user(
        "<command-message>model</command-message>\n<command-name>/model</command-name>\n<command-args></command-args>"
    )
    c.user("<local-command-stdout>Set model to opus</local-command-stdout>")
    c.user(
        "<command-message>review is running…</command-message>\n<command-name>/review</command-name>\n"
        "<command-args>the parser, carefully</command-args>"
    )
    c.user("Review the code below ...", isMeta=True)
    c.block("m1", text("Looks fine."), "end_turn")
    c.user("<command-name>/cost</command-name>\n<command-message>cost</command-message>\n<command-args></command-args>")
    c.user("<local-command-stdout>Total cost: $0.12</local-command-stdout>")
    c.user("Thanks.", promptId="p9")
    c.block("m2", text("You're welcome."), "end_turn")
    turns = feed(ClaudeCodeSession("S"), c.lines, settle=True)
    assert [(prompt(t), t.seq) for t in turns] == [("/review the parser, carefully", 1), ("Thanks.", 2)]


def test_a_reply_that_opens_with_a_whitespace_only_block_and_an_api_error() -> None:
    c = Claude()
    c.user("Hi", promptId="p1")
    c.block("m1", text("\n\n"), None)
    c.block("m1", text("Hello."), "end_turn")
    c.user("Again", promptId="p2")
    c.block("m2", text("API Error: 529 overloaded"), "stop_sequence", isApiErrorMessage=True)
    turns = feed(ClaudeCodeSession("S"), c.lines, settle=True)
    assert [(reply(t), outcome(t)) for t in turns] == [("Hello.", "answered"), ("API Error: 529 overloaded", "aborted")]


# ------------------------------------------------------------------------------------------ Codex


def rollout(*events: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    meta = ("session_meta", {"id": "T", "cwd": "/c", "cli_version": "0.40.0", "originator": "codex_vscode"})
    return [
        {"timestamp": f"2026-02-01T10:00:{i:02d}.000Z", "type": k, "payload": p}
        for i, (k, p) in enumerate([meta, *events])
    ]


def ev(event: str, **payload: Any) -> tuple[str, dict[str, Any]]:
    return ("event_msg", {"type": event, **payload})


def item(**payload: Any) -> tuple[str, dict[str, Any]]:
    return ("response_item", payload)


def test_a_rollout_without_task_started_makes_a_turn_of_each_prompt() -> None:
    lines = rollout(
        ("turn_context", {"cwd": "/c"}),
        item(
            type="message",
            role="user",
            content=[{"type": "input_text", "text": "<environment_context>x</environment_context>"}],
        ),
        ev("user_message", message="List files", kind="plain", images=[]),
        item(type="function_call", name="shell", arguments='{"command":["ls"]}', call_id="c1"),
        item(type="function_call_output", call_id="c1", output="a b"),
        ev("agent_message", message="a and b"),
        ev("token_count", info=None),
        ev("user_message", message="Delete b", kind="plain", images=[]),
        ev("agent_message", message="Deleting"),
        ev("turn_aborted", reason="interrupted"),
        ev("user_message", message="Just read a", kind="plain", images=[]),
        ev("agent_message", message="a says hi"),
    )
    parser = CodexSession("T")
    turns = feed(parser, lines)
    assert [(prompt(t), t.seq, outcome(t), reply(t)) for t in turns] == [
        ("List files", 1, "answered", "a and b"),
        ("Delete b", 2, "interrupted", "Deleting"),
    ]
    assert at(turns[0]) == "2026-02-01T10:00:06.000000Z"  # its last agent line, not the next prompt's
    (last,) = parser.settle()
    assert (prompt(last), last.seq, outcome(last)) == ("Just read a", 3, "answered")


def test_an_aborted_codex_turn_is_a_turn_and_a_replaced_one_is_aborted() -> None:
    lines = rollout(
        ev("task_started", turn_id="t1"),
        ev("user_message", message="Build it", images=["data:image/png;base64,AAAA"]),
        ev("agent_message", message="Building"),
        ev("turn_aborted", turn_id="t1", reason="interrupted"),
        ev("task_started", turn_id="t2"),
        ev("user_message", message="Test it", images=[]),
        ev("turn_aborted", turn_id="t2", reason="replaced"),
        ev("task_started", turn_id="t3"),
        ev("user_message", message="Lint it", images=[]),
        ev("task_complete", turn_id="t3", last_agent_message="Clean."),
    )
    parser = CodexSession("T")
    turns = feed(parser, lines)
    assert [(t.turn_id, t.seq, outcome(t), prompt(t)) for t in turns] == [
        ("t1", 1, "interrupted", "Build it\n\n[image]"),
        ("t2", 2, "aborted", "Test it"),
        ("t3", 3, "answered", "Lint it"),
    ]
    assert parser.settle() == []


def test_settle_never_ends_a_started_codex_turn() -> None:
    lines = rollout(
        ev("task_started", turn_id="t1"), ev("user_message", message="Go"), ev("agent_message", message="Done")
    )
    assert feed(CodexSession("T"), lines, settle=True) == []


# ------------------------------------------------------------------------------------------ the hook's view


CLAUDE_STEPS = st.lists(
    st.sampled_from(["prompt", "think", "text", "tool", "result", "end", "summary", "duration", "interrupt", "notify"]),
    max_size=30,
)


def claude_run(steps: list[str], version: str) -> Claude:
    c = Claude(version)
    msg = 0
    for i, step in enumerate(steps):
        if step == "prompt":
            msg += 1
            c.user(f"q{i}", promptId=f"p{i}")
        elif step in ("think", "text", "end"):
            stop = "end_turn" if (step == "end" or version.startswith("2.1.2")) and step != "think" else None
            c.block(f"m{msg}", THINK if step == "think" else text(f"r{i}"), stop)
        elif step == "tool":
            msg += 1
            c.block(f"m{msg}", tool(f"t{i}"), None)
        elif step == "result":
            c.result(f"t{i - 1}")
        elif step == "summary":
            c.system("stop_hook_summary", hookCount=1, hookInfos=[], hookErrors=[], preventedContinuation=False)
        elif step == "duration":
            c.system("turn_duration", durationMs=10)
        elif step == "interrupt":
            c.user([text("[Request interrupted by user]")])
        else:
            c.user("<task-notification>done</task-notification>")
    return c


@given(steps=CLAUDE_STEPS, version=st.sampled_from(["2.0.50", "2.1.30", "2.1.250"]))
@settings(max_examples=300, deadline=None)
def test_a_hook_called_before_each_stop_hook_summary_sends_what_a_later_reader_sends(
    steps: list[str], version: str
) -> None:
    """The host calls its Stop hook after the turn's last line and before ``stop_hook_summary``: the turns
    the hook sends (the prefix, settled) are the later reader's first turns, byte for byte."""
    lines = claude_run(steps, version).lines
    full = feed(ClaudeCodeSession("S"), lines)
    key = lambda ts: [(t.turn_id, t.seq, t.body, t.completed_at_micros) for t in ts]  # noqa: E731
    for cut, entry in enumerate(lines):
        if entry.get("subtype") != "stop_hook_summary":
            continue
        parser = ClaudeCodeSession("S")
        hooked = feed(parser, lines[:cut]) + parser.settle(final=True)  # as the hook settles
        assert key(full[: len(hooked)]) == key(hooked)
