"""ToyChat passes throughline's conformance kit for host adapters (run: pytest examples/host-adapter/tests)."""

from __future__ import annotations

from pathlib import Path

from throughline_host_toychat import ToyChatHost

from throughline.producers.hosts.adapter import HostAdapter
from throughline.testing.hosts import HostAdapterContract

FIXTURES = Path(__file__).resolve().parent / "fixtures"


class TestToyChat(HostAdapterContract):
    def adapter(self) -> HostAdapter:
        return ToyChatHost()

    def sessions(self) -> list[str]:
        return [str(FIXTURES / "s1.jsonl")]

    def injected_texts(self) -> list[str]:
        return ["TOYCHAT-CONTEXT"]

    def expected_turns(self, session: str) -> list[tuple[str, int, str]]:
        # p-4 is the open turn settle() completes; the rewind to p-2 makes it seq 2
        return [
            ("p-1", 1, "answered"),
            ("p-2", 2, "interrupted"),
            ("p-3", 3, "answered"),
            ("p-4", 2, "answered"),
        ]

    def hook_points(self, session: str) -> list[int]:
        return [5, 10, 13]  # ToyChat runs its stop hook after "done" (and after the last reply)

    def has_rewinds(self) -> bool:
        return True
