"""Every durable replace writes the file, fsyncs it, renames it over the target and then fsyncs the directory.

The savers are observed through ``os.fsync`` and ``os.replace`` themselves (not through the helper), so a
saver that skipped the helper, or a helper that dropped a step, fails here.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from throughline.durable import replace_file
from throughline.producers.ingest.state import FileId, IngestState, save_ingest_state, save_session_states
from throughline.reader.observer import save_observer_state
from throughline.reader.token_key import load_or_create_key

Event = tuple[str, int]  # ("file" | "dir", inode) for an fsync, ("replace", inode of what was renamed)


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Event]]:
    seen: list[Event] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        info = os.fstat(fd)
        seen.append(("dir" if stat.S_ISDIR(info.st_mode) else "file", info.st_ino))
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        seen.append(("replace", os.stat(src).st_ino))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    yield seen


def _assert_durable_replace(events: list[Event], target: Path) -> None:
    file_inode = target.stat().st_ino
    dir_inode = target.parent.stat().st_ino
    assert events == [("file", file_inode), ("replace", file_inode), ("dir", dir_inode)]


STATE = IngestState(FileId(1, 2), offset=10, line=3, line_start=5, line_sha256=b"\x01" * 32)

SAVERS: dict[str, Callable[[Path], None]] = {
    "replace_file": lambda p: replace_file(p, b"new\n"),
    "ingest state": lambda p: save_ingest_state(str(p), STATE, source_path="/x/in.jsonl"),
    "sessions state": lambda p: save_session_states(str(p), {"/x/a.jsonl": STATE}, format="claude-code"),
    "observer state": lambda p: save_observer_state(p, None),
}


@pytest.mark.parametrize("name", sorted(SAVERS))
def test_a_save_fsyncs_the_file_then_renames_then_fsyncs_the_directory(
    name: str, tmp_path: Path, events: list[Event]
) -> None:
    target = tmp_path / "state" / "saved.json"
    target.parent.mkdir()
    target.write_bytes(b"old\n")
    SAVERS[name](target)
    _assert_durable_replace(events, target)
    assert [p.name for p in target.parent.iterdir()] == ["saved.json"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "saved.json"
    target.write_bytes(b"old\n")

    def full_disk(fd: int, data: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(OSError, match="No space left"):
        replace_file(target, b"new\n")
    assert target.read_bytes() == b"old\n" and [p.name for p in tmp_path.iterdir()] == ["saved.json"]


def test_a_new_page_token_key_is_fsynced_before_its_name_and_the_directory_after(
    tmp_path: Path, events: list[Event]
) -> None:
    key_path = tmp_path / "token.key"
    load_or_create_key(key_path)
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "file" and kinds[-1] == "dir" and events[-1][1] == tmp_path.stat().st_ino
