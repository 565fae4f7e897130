"""The ``pytest11`` entry point: throughline's pytest plugin, only where the ``test`` extra is installed.

``pip install throughline`` must not put fixtures, hooks and a Kafka client import into every pytest run
of the user's machine; ``pip install 'throughline[test]'`` (which brings testcontainers) turns the
plugin (``throughline.testing.pytest_plugin``) on, so that a user's suite gets the fixtures with
nothing to import. ``THROUGHLINE_PYTEST_PLUGIN=0`` turns it off even then; a suite that wants it
regardless names it: ``pytest_plugins = ["throughline.testing.pytest_plugin"]`` or
``-p throughline.testing.pytest_plugin``.

This module imports nothing of throughline's own: deciding costs one ``find_spec``.
"""

from __future__ import annotations

import importlib.util
import os

#: The extra's own dependency that marks the ``test`` extra as installed.
EXTRA_MARKER = "testcontainers"


def plugin_enabled() -> bool:
    """Whether the entry point loads the plugin in this environment."""
    if os.environ.get("THROUGHLINE_PYTEST_PLUGIN", "").strip().lower() in {"0", "off", "false", "no"}:
        return False
    return importlib.util.find_spec(EXTRA_MARKER) is not None


pytest_plugins = ["throughline.testing.pytest_plugin"] if plugin_enabled() else []
