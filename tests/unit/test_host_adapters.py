"""Every built-in host adapter passes the conformance kit (``throughline.testing.hosts``) on its fixtures,
and the registry finds hosts by the ``throughline.hosts`` entry point group."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from support.opencode_store import build_store

from throughline.producers.hosts.adapter import HostAdapter
from throughline.producers.hosts.files import FORMATS
from throughline.producers.hosts.opencode_db import OpenCodeSource
from throughline.producers.hosts.registry import BUILTIN, UnknownHostError, adapter
from throughline.testing.hosts import HostAdapterContract

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
ADAPTED = FIXTURES / "adapters"
EXPECTED = json.loads((ADAPTED / "expected.json").read_text())


HUGE = "x" * (700 * 1024)  # over MAX_BODY_BYTES on its own


def write_lines(path: Path, entries: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return str(path)


def expected(host: str) -> list[tuple[str, int, str]]:
    return [(turn_id, seq, outcome) for turn_id, seq, outcome, _ in EXPECTED["turns"][host]]


class TestClaudeCode(HostAdapterContract):
    def adapter(self) -> HostAdapter:
        return adapter("claude-code")

    def sessions(self) -> list[str]:
        return self.adapter().session_files(str(FIXTURES / "claude-code"))

    def injected_texts(self) -> list[str]:
        return ["<local-command-stdout>", "<system-reminder>", "<task-notification>"]


class TestCodex(HostAdapterContract):
    def adapter(self) -> HostAdapter:
        return adapter("codex")

    def sessions(self) -> list[str]:
        return self.adapter().session_files(str(FIXTURES / "codex"))

    def injected_texts(self) -> list[str]:
        return ["<environment_context>", "<user_instructions>"]


class TestQwenCode(HostAdapterContract):
    def adapter(self) -> HostAdapter:
        return adapter("qwen-code")

    def sessions(self) -> list[str]:
        return [str(ADAPTED / EXPECTED["sessions"]["qwen-code"])]

    def injected_texts(self) -> list[str]:
        return ["Background task bg-1 finished.", "Check it runs."]

    def oversized_session(self, folder: Path) -> str:
        base = {"sessionId": "S", "cwd": "/w", "timestamp": "2026-05-01T10:00:00Z"}
        return write_lines(
            folder / "chats" / "S.jsonl",
            [
                {
                    **base,
                    "type": "user",
                    "uuid": "u",
                    "parentUuid": None,
                    "message": {"role": "user", "parts": [{"text": "Go."}]},
                },
                {
                    **base,
                    "type": "assistant",
                    "uuid": "a",
                    "parentUuid": "u",
                    "message": {"role": "model", "parts": [{"text": HUGE}]},
                },
            ],
        )

    def hook_points(self, session: str) -> list[int]:
        return [4, 7, 10, 12]  # after each reply that ends the host's agent loop

    def expected_turns(self, session: str) -> list[tuple[str, int, str]]:
        return expected("qwen-code")

    def has_rewinds(self) -> bool:
        return True


class TestGeminiCli(HostAdapterContract):
    def adapter(self) -> HostAdapter:
        return adapter("gemini-cli")

    def sessions(self) -> list[str]:
        return [str(ADAPTED / EXPECTED["sessions"]["gemini-cli"])]

    def injected_texts(self) -> list[str]:
        return ["<session_context>", "/model", "Model set to"]

    def oversized_session(self, folder: Path) -> str:
        return write_lines(
            folder / "chats" / "session-x.jsonl",
            [
                {"sessionId": "S", "projectHash": "h"},
                {"id": "u", "timestamp": "2026-05-01T10:00:00Z", "type": "user", "content": HUGE},
                {"id": "g", "timestamp": "2026-05-01T10:00:01Z", "type": "gemini", "content": "Done."},
            ],
        )

    def hook_points(self, session: str) -> list[int]:
        return [7, 12, 14, 16, 19]  # after each reply that ends the host's agent loop

    def expected_turns(self, session: str) -> list[tuple[str, int, str]]:
        return expected("gemini-cli")

    def has_rewinds(self) -> bool:
        return True


class TestGeminiCliLegacyDocuments(HostAdapterContract):
    """``session-*.json`` of the versions before JSON Lines (a ``.json`` converted to ``.jsonl`` is left out)."""

    def adapter(self) -> HostAdapter:
        return adapter("gemini-cli")

    def sessions(self) -> list[str]:
        return self.adapter().session_files(str(ADAPTED / "gemini-cli-legacy"))

    def expected_turns(self, session: str) -> list[tuple[str, int, str]]:
        return [("old-u1", 1, "answered"), ("old-u2", 2, "answered")]


def test_a_converted_gemini_session_is_read_from_its_jsonl_only() -> None:
    names = [Path(p).name for p in adapter("gemini-cli").session_files(str(ADAPTED / "gemini-cli-legacy"))]
    assert names == ["session-2025-11-01T09-00-0ld0c0de.json", "session-2025-11-02T09-00-c0nv0000.jsonl"]


class TestCopilotCli(HostAdapterContract):
    def adapter(self) -> HostAdapter:
        return adapter("copilot-cli")

    def sessions(self) -> list[str]:
        return [str(ADAPTED / EXPECTED["sessions"]["copilot-cli"])]

    def injected_texts(self) -> list[str]:
        return ["pdf skill", "<current_datetime>"]

    def oversized_session(self, folder: Path) -> str:
        def ev(kind: str, data: dict, eid: str) -> dict:
            return {"type": kind, "data": data, "id": eid, "timestamp": "2026-05-01T10:00:00Z"}

        return write_lines(
            folder / "s" / "events.jsonl",
            [
                ev("session.start", {"sessionId": "S", "context": {"cwd": "/w"}}, "e1"),
                ev("user.message", {"content": "Go."}, "e2"),
                ev("assistant.message", {"messageId": "m", "content": HUGE, "toolRequests": []}, "e3"),
                ev("assistant.turn_end", {"turnId": "0"}, "e4"),
            ],
        )

    def hook_points(self, session: str) -> list[int]:
        return [10, 20]  # after each reply that ends the host's agent loop

    def expected_turns(self, session: str) -> list[tuple[str, int, str]]:
        return expected("copilot-cli")


class TestOpenCode(HostAdapterContract):
    store: Path | None = None

    def adapter(self) -> HostAdapter:
        return adapter("opencode")

    def _store(self) -> Path:
        if TestOpenCode.store is None:
            folder = Path(tempfile.mkdtemp(prefix="opencode-"))
            TestOpenCode.store = build_store(folder / "opencode.db", ADAPTED / EXPECTED["sessions"]["opencode"])
        return TestOpenCode.store

    def sessions(self) -> list[str]:
        return [f"{self._store()}#ses_1", f"{self._store()}#ses_2"]

    def records(self, session: str) -> list[bytes]:
        source = OpenCodeSource(self.adapter(), [str(self._store())])
        try:
            return [line.data for line in source.lines() if line.path == session]
        finally:
            source.close()

    def injected_texts(self) -> list[str]:
        return ["Called the Read tool", "Subtask prompt."]

    def expected_turns(self, session: str) -> list[tuple[str, int, str]]:
        return expected("opencode") if session.endswith("#ses_1") else []


# ------------------------------------------------------------------------------------------- registry


def test_the_registry_holds_every_built_in_host_from_the_entry_points() -> None:
    from importlib.metadata import entry_points

    registered = {ep.name: ep.value for ep in entry_points(group="throughline.hosts")}
    assert registered == BUILTIN  # pyproject.toml declares exactly the built-in table
    assert set(FORMATS) == set(BUILTIN)
    for name in BUILTIN:
        assert adapter(name).name == name


def test_an_unknown_host_is_a_typed_input_error() -> None:
    with pytest.raises(UnknownHostError) as caught:
        adapter("no-such-host")
    assert caught.value.code == "unknown_host" and "claude-code" in caught.value.message


def test_hosts_with_a_hook_are_the_hook_choices() -> None:
    from throughline.producers.hook import hook_hosts

    assert hook_hosts() == ("claude-code", "codex", "copilot-cli", "gemini-cli", "qwen-code")
