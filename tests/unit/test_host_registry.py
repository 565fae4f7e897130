"""The host registry: adapters come from the ``throughline.hosts`` entry points, a broken or impostor
plug-in is left out with its reason, and the built-ins are there even when installed metadata is older."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import EntryPoint
from typing import Any

import pytest

from throughline.producers.hosts import registry
from throughline.producers.hosts.adapter import HostAdapter
from throughline.producers.hosts.builtin import ClaudeCodeHost
from throughline.producers.hosts.lines import SessionParser


class _Dist:
    def __init__(self, name: str) -> None:
        self.metadata = {"Name": name}


def _ep(name: str, value: str, dist: str) -> EntryPoint:
    ep = EntryPoint(name, value, registry.GROUP)
    return ep._for(_Dist(dist))  # type: ignore[attr-defined]


class GoodHost(ClaudeCodeHost):
    name = "good"  # type: ignore[assignment]


class WrongName(ClaudeCodeHost):
    name = "other"  # type: ignore[assignment]


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[EntryPoint]]:
    eps: list[EntryPoint] = []
    monkeypatch.setattr(registry, "entry_points", lambda group: [e for e in eps if e.group == group])
    monkeypatch.setattr(registry, "_loaded", None)
    monkeypatch.setattr(registry, "_errors", {})
    yield eps


def test_a_plug_in_entry_point_adds_a_host(installed: list[EntryPoint]) -> None:
    installed.append(_ep("good", f"{__name__}:GoodHost", "throughline-host-good"))
    assert isinstance(registry.adapter("good"), GoodHost)
    assert set(registry.names()) == {"good", *registry.BUILTIN}


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (f"{__name__}:NoSuchThing", "AttributeError"),
        ("no_such_module_anywhere:Host", "ModuleNotFoundError"),
        (f"{__name__}:WrongName", "registered as 'wrong'"),
        (f"{__name__}:_Dist", "not a HostAdapter"),
    ],
)
def test_a_broken_plug_in_is_left_out_and_said_when_asked_for(
    installed: list[EntryPoint], value: str, why: str
) -> None:
    installed.append(_ep("wrong", value, "throughline-host-wrong"))
    assert "wrong" not in registry.names()
    assert registry.adapter("codex").name == "codex"  # the other hosts still work
    with pytest.raises(registry.UnknownHostError, match=why):
        registry.adapter("wrong")


def test_a_plug_in_cannot_take_a_built_in_name(installed: list[EntryPoint]) -> None:
    installed.append(_ep("codex", f"{__name__}:GoodHost", "throughline-host-evil"))
    assert type(registry.adapter("codex")).__name__ == "CodexHost"


def test_built_ins_are_there_without_any_entry_point(installed: list[EntryPoint]) -> None:
    assert registry.names() == tuple(sorted(registry.BUILTIN))
    assert all(isinstance(registry.adapter(n), HostAdapter) for n in registry.BUILTIN)


@pytest.mark.parametrize("port", [HostAdapter, SessionParser])
def test_every_abstract_method_states_its_threading_and_lifecycle(port: type) -> None:
    abstract: dict[str, Any] = {name: getattr(port, name) for name in port.__abstractmethods__}
    assert abstract
    for name, method in abstract.items():
        doc = (method.fget if isinstance(method, property) else method).__doc__ or ""
        assert "thread" in doc and ("Called" in doc or "Read" in doc), (
            f"{port.__name__}.{name}: when, from which thread?"
        )
