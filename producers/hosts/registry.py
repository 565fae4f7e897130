"""The host adapters this installation knows: the ``throughline.hosts`` entry point group.

Each entry point's name is a ``--format`` name and its object a ``HostAdapter`` subclass::

    [project.entry-points."throughline.hosts"]
    foo = "throughline_host_foo:FooHost"

throughline's own hosts are declared the same way in its pyproject.toml. ``BUILTIN`` names them too,
so a checkout whose installed metadata predates a built-in host (an editable install not reinstalled
after a pull) still has every built-in host; an entry point of another distribution cannot take a
built-in name. An adapter that fails to load is left out and its error is given when its name is
asked for: one broken plug-in does not stop the other hosts.
"""

from __future__ import annotations

import importlib
import threading
from importlib.metadata import EntryPoint, entry_points

from throughline.producers.exceptions import UnknownHostError
from throughline.producers.hosts.adapter import HostAdapter

__all__ = ["BUILTIN", "GROUP", "UnknownHostError", "adapter", "adapters", "names"]

GROUP = "throughline.hosts"
#: The hosts throughline ships (the same objects its pyproject.toml registers under ``GROUP``).
BUILTIN = {
    "claude-code": "throughline.producers.hosts.builtin:ClaudeCodeHost",
    "codex": "throughline.producers.hosts.builtin:CodexHost",
    "copilot-cli": "throughline.producers.hosts.copilot_cli:CopilotCliHost",
    "gemini-cli": "throughline.producers.hosts.gemini_cli:GeminiCliHost",
    "opencode": "throughline.producers.hosts.opencode:OpenCodeHost",
    "qwen-code": "throughline.producers.hosts.qwen_code:QwenCodeHost",
}
_OWN_DISTRIBUTION = "throughline"

_lock = threading.Lock()
_loaded: dict[str, HostAdapter] | None = None
_errors: dict[str, str] = {}


def _instance(target: object, name: str) -> HostAdapter:
    if isinstance(target, type) and issubclass(target, HostAdapter):
        target = target()
    if not isinstance(target, HostAdapter):
        raise TypeError(f"{target!r} is not a HostAdapter subclass")
    if getattr(target, "name", None) != name:
        raise TypeError(f"its name is {getattr(target, 'name', None)!r}, registered as {name!r}")
    if target.reads not in ("lines", "rows"):
        raise TypeError(f"reads must be 'lines' or 'rows', not {target.reads!r}")
    return target


def _load_reference(reference: str) -> object:
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _distribution(ep: EntryPoint) -> str | None:
    dist = getattr(ep, "dist", None)
    return dist.metadata["Name"] if dist is not None else None


def _load() -> dict[str, HostAdapter]:
    found: dict[str, HostAdapter] = {}
    for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        if ep.name in found or ep.name in _errors:
            continue
        if ep.name in BUILTIN and _distribution(ep) not in (None, _OWN_DISTRIBUTION):
            _errors[ep.name] = f"{ep.value} (from {_distribution(ep)}) cannot replace the built-in {ep.name!r}"
            continue
        try:
            found[ep.name] = _instance(ep.load(), ep.name)
        except Exception as exc:  # a broken plug-in: said when its name is asked for, the rest still work
            _errors[ep.name] = f"{ep.value}: {type(exc).__name__}: {exc}"
    for name, reference in BUILTIN.items():
        if name not in found:
            found[name] = _instance(_load_reference(reference), name)
            _errors.pop(name, None)
    return dict(sorted(found.items()))


def adapters() -> dict[str, HostAdapter]:
    """Every loadable adapter by name (loaded once per process; thread-safe)."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _load()
        return _loaded


def names() -> tuple[str, ...]:
    """The ``--format`` names, sorted."""
    return tuple(adapters())


def adapter(name: str) -> HostAdapter:
    """The adapter of ``name`` (``UnknownHostError``: not installed, or it failed to load)."""
    found = adapters().get(name)
    if found is None:
        why = _errors.get(name)
        detail = f": {why}" if why else f"; installed: {', '.join(adapters())}"
        raise UnknownHostError(f"no host adapter {name!r}{detail}")
    return found
