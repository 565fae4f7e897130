"""``--sync-commits`` on ``project`` and ``serve`` reaches the projection they open (``store.durability``:
commits are not fsynced unless it is given)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from throughline.cli import main
from throughline.projector.store import DuckProjection


class _Opened(Exception):
    """Raised by the stand-in for ``DuckProjection.open`` once it saw its arguments."""


@pytest.mark.parametrize(("argv", "wanted"), [((), False), (("--sync-commits",), True)])
def test_project_opens_its_projection_with_the_flag(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, argv: tuple[str, ...], wanted: bool
) -> None:
    seen: dict[str, Any] = {}

    def open_(cls: type, path: Any, **kwargs: Any) -> DuckProjection:
        seen.update(kwargs)
        raise _Opened

    monkeypatch.setattr(DuckProjection, "open", classmethod(open_))
    with pytest.raises(_Opened):
        main(["project", "--bootstrap-servers", "127.0.0.1:1", "--db", str(tmp_path / "p.duckdb"), *argv])
    assert seen["sync_commits"] is wanted


@pytest.mark.parametrize(("argv", "wanted"), [((), False), (("--sync-commits",), True)])
def test_serve_passes_the_flag_to_its_service(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, argv: tuple[str, ...], wanted: bool
) -> None:
    import throughline.serve.service as service

    seen: list[Any] = []
    monkeypatch.setattr(service, "run_service", lambda settings, options, **_: seen.append(options) or 0)
    assert main(["serve", "--bootstrap-servers", "127.0.0.1:1", "--db", str(tmp_path / "p.duckdb"), *argv]) == 0
    assert seen[0].sync_commits is wanted
