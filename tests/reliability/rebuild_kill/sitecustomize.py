"""Test-only crash injection: SIGKILL ``serve`` (its whole process group) at one step of a rebuild.

On the ``PYTHONPATH`` of a ``throughline serve`` started with ``THROUGHLINE_TEST_KILL_AT_REBUILD=STEP``:

- ``replaying``: right after the new file's first commit, long before any switch;
- ``paused``: the live projector paused for the switch (its staged polls committed), no marker yet;
- ``marked``: the marker written (the new file is the projection), reads not switched yet;
- ``switched``: reads switched to the new file, the old handle not closed, the old file still there;
- ``removed``: the old file removed, the live projector not resumed yet.

Nothing of production is changed: methods are wrapped at start-up (tests/reliability/test_rebuild_kill.py).
"""

from __future__ import annotations

import os
import signal

_step = os.environ.get("THROUGHLINE_TEST_KILL_AT_REBUILD")


def _die() -> None:
    os.killpg(os.getpgid(0), signal.SIGKILL)  # serve and its fetch workers, as a kill -9 of the group


if _step:
    from throughline.projector.rebuild_files import RebuildFiles
    from throughline.projector.store import DuckProjection
    from throughline.serve.rebuild import PausableProjector
    from throughline.serve.switchable import SwitchableProjection

    def _after(cls: type, name: str, when: str, check=lambda result, args: True) -> None:
        real = getattr(cls, name)

        def wrapped(*args, **kwargs):
            result = real(*args, **kwargs)
            if _step == when and check(result, args):
                _die()
            return result

        setattr(cls, name, wrapped)

    # A commit of the new file's projector (the live file's path does not end so).
    _after(DuckProjection, "apply_prepared", "replaying", lambda result, args: str(args[0].path).endswith(".rebuild"))
    _after(PausableProjector, "pause", "paused", lambda result, args: bool(result))
    _after(RebuildFiles, "mark_switched", "marked")
    _after(SwitchableProjection, "switch", "switched")
    _after(RebuildFiles, "remove_old", "removed")
