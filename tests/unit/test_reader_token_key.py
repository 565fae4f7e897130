"""The page-token key: configuration first, else one generated file beside the projection."""

from __future__ import annotations

import base64
import multiprocessing
import os
import stat
from pathlib import Path

import pytest

from throughline.reader import (
    ENV_TOKEN_KEY,
    ENV_TOKEN_KEY_FILE,
    KEY_FILE_NAME,
    TokenKeyError,
    default_key_path,
    load_or_create_key,
    parse_token_key,
    resolve_token_key,
)

HEX = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"


def test_env_hex_wins(tmp_path: Path) -> None:
    key_file = tmp_path / "k"
    key_file.write_text("ff" * 32)
    env = {ENV_TOKEN_KEY: HEX, ENV_TOKEN_KEY_FILE: str(key_file)}
    assert resolve_token_key(db_path=tmp_path / "p.duckdb", key_file=key_file, environ=env) == bytes.fromhex(HEX)
    assert not (tmp_path / KEY_FILE_NAME).exists()


def test_env_base64url(tmp_path: Path) -> None:
    raw = bytes(range(40))
    for text in (base64.urlsafe_b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode().rstrip("=")):
        assert resolve_token_key(db_path=None, environ={ENV_TOKEN_KEY: text}) == raw


@pytest.mark.parametrize("text", ["", "abc", "00" * 31, "zz" * 20, base64.urlsafe_b64encode(bytes(31)).decode(), "a b"])
def test_malformed_key_text_is_refused(text: str) -> None:
    with pytest.raises(TokenKeyError) as info:
        parse_token_key(text, source="test")
    assert info.value.code == "token_key_unavailable"


def test_malformed_env_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TokenKeyError):
        resolve_token_key(db_path=tmp_path / "p.duckdb", environ={ENV_TOKEN_KEY: "short"})


def test_key_file_flag_then_env_file(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("aa" * 32 + "\n")
    b.write_text("bb" * 32)
    assert resolve_token_key(db_path=None, key_file=a, environ={ENV_TOKEN_KEY_FILE: str(b)}) == b"\xaa" * 32
    assert resolve_token_key(db_path=None, environ={ENV_TOKEN_KEY_FILE: str(b)}) == b"\xbb" * 32


def test_explicit_key_file_must_exist(tmp_path: Path) -> None:
    with pytest.raises(TokenKeyError) as info:
        resolve_token_key(db_path=tmp_path / "p.duckdb", key_file=tmp_path / "missing", environ={})
    assert "missing" in info.value.message
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("content", [b"", b"\xff" * 64, b"xx" * 20, b"a" * 5000])
def test_malformed_key_file_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "k"
    path.write_bytes(content)
    with pytest.raises(TokenKeyError):
        resolve_token_key(db_path=None, key_file=path, environ={})


def test_default_file_is_created_once_beside_the_projection(tmp_path: Path) -> None:
    db = tmp_path / "proj" / "p.duckdb"
    db.parent.mkdir()
    first = resolve_token_key(db_path=db, environ={})
    path = db.parent / KEY_FILE_NAME
    assert default_key_path(db) == path
    assert len(first) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == first.hex() + "\n"
    # A restart, and a replay into a new file in the same directory, keep the key.
    assert resolve_token_key(db_path=db, environ={}) == first
    assert resolve_token_key(db_path=db.parent / "replayed.duckdb", environ={}) == first
    assert sorted(os.listdir(db.parent)) == [KEY_FILE_NAME]  # not inside the projection, no temp files


def test_no_db_and_no_configuration_is_a_clear_error() -> None:
    with pytest.raises(TokenKeyError) as info:
        resolve_token_key(db_path=None, environ={})
    assert ENV_TOKEN_KEY in info.value.message and info.value.exit_code == 2


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_directory_is_a_clear_error(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(TokenKeyError) as info:
            resolve_token_key(db_path=ro / "p.duckdb", environ={})
        assert ENV_TOKEN_KEY in info.value.message and str(ro) in info.value.message
    finally:
        ro.chmod(0o700)


def test_unwritable_file_system_is_a_clear_error() -> None:
    # /proc refuses new files even to root (the permission test above is skipped for root).
    with pytest.raises(TokenKeyError) as info:
        resolve_token_key(db_path="/proc/throughline-test.duckdb", environ={})
    assert "cannot create" in info.value.message


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TokenKeyError):
        resolve_token_key(db_path=tmp_path / "nope" / "p.duckdb", environ={})


def _create(path: str) -> str:
    return load_or_create_key(path).hex()


def test_concurrent_creators_converge(tmp_path: Path) -> None:
    path = str(tmp_path / KEY_FILE_NAME)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(4) as pool:
        keys = pool.map(_create, [path] * 16)
    assert len(set(keys)) == 1
    assert Path(path).read_text().strip() == keys[0]
