"""Where each host keeps its session files, and which files under a folder are sessions: by format name.

Each host's adapter (``throughline.producers.hosts.adapter.HostAdapter``, found in the registry by its
format name) knows its own; these functions are the by-name entry points the ingest and hook commands
use. ``FORMATS`` is the names of the installed hosts (computed when first asked for, from the
``throughline.hosts`` entry points). A path given explicitly that is a file is a session file whatever
its name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from throughline.producers.hosts.lines import SessionParser
from throughline.producers.hosts.registry import adapter, names

__all__ = [
    "FORMATS",  # noqa: F822 (computed on first use, by __getattr__)
    "SessionParser",
    "default_roots",
    "default_thread",
    "is_session_name",
    "new_parser",
    "session_files",
]


def __getattr__(name: str) -> tuple[str, ...]:
    # ``FORMATS`` is computed on first use: loading the adapters imports their modules, which import this
    # package, so it cannot be done while the package itself is being imported.
    if name == "FORMATS":
        return names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def default_roots(format: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """The folders searched when ``ingest --format FORMAT`` is given no PATH."""
    return adapter(format).default_roots(os.environ if environ is None else environ)


def is_session_name(format: str, name: str) -> bool:
    """Whether a file name found under a searched folder is one of the host's session files."""
    return adapter(format).is_session_file(name)


def session_files(format: str, root: str) -> list[str]:
    """The JSON Lines session files at ``root`` (itself when it is one), sorted; none when it does not exist.

    Whole-document sessions (``HostAdapter.is_document``) are left to ``records.DocumentSource``.
    """
    host = adapter(format)
    found = host.session_files(root)
    return [p for p in found if not host.is_document(p)] if host.has_documents else found


def default_thread(format: str, path: str) -> str:
    """The thread of a file whose lines name none: its session id as the file name gives it."""
    return adapter(format).default_thread(path)


def new_parser(format: str, path: str) -> SessionParser:
    """A fresh parser for one session file of ``format``."""
    return adapter(format).new_parser(path)
