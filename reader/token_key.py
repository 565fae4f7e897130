"""The page-token key: found in configuration, or generated once and kept beside the projection.

Page tokens carry an HMAC-SHA-256 tag, so the key must outlive a restart and a projection rebuild,
or every token in flight would be refused. Where the key comes from, first match wins:

1. ``THROUGHLINE_TOKEN_KEY``: 64 hex characters, or base64url (padding optional) of at least 32 bytes.
2. ``--token-key-file`` / ``THROUGHLINE_TOKEN_KEY_FILE``: a file holding the key in either form (it
   must exist; it is never created).
3. The default file ``throughline-token.key`` in the directory of the DuckDB projection file: *beside*
   the projection, not inside it, so a replay into a new file in the same directory keeps the key.
   It is created on first use (32 random bytes as 64 hex characters, mode 0600). A replay into another
   directory needs the old key file copied there, or the key passed by variable or file.

Creation is atomic: the key is written and fsynced under a temporary name (``O_CREAT | O_EXCL``, mode
0600) and then hard-linked into place, which fails if another process got there first; the loser reads
the winner's key, so concurrent creators converge on one key. On a file system without hard links the
final name is created with ``O_CREAT | O_EXCL`` directly and a loser waits (bounded) for the winner's
complete key.
"""

from __future__ import annotations

import binascii
import contextlib
import errno
import os
import re
import secrets
import time
from collections.abc import Mapping
from pathlib import Path

from throughline.core.encoding import b64url_decode
from throughline.durable import sync_directory, write_fully
from throughline.reader.exceptions import TokenKeyError

ENV_TOKEN_KEY = "THROUGHLINE_TOKEN_KEY"
ENV_TOKEN_KEY_FILE = "THROUGHLINE_TOKEN_KEY_FILE"
KEY_FILE_NAME = "throughline-token.key"
KEY_BYTES = 32
_MAX_KEY_FILE_BYTES = 4096
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_CONVERGE_WAIT_S = 2.0


def parse_token_key(text: str, *, source: str) -> bytes:
    """Decode a key given as 64 hex characters or base64url of >= 32 bytes; ``source`` names its origin."""
    value = text.strip()
    if _HEX64.fullmatch(value):
        return binascii.unhexlify(value)
    data = b64url_decode(value.rstrip("="))
    if data is not None and len(data) >= KEY_BYTES:
        return data
    raise TokenKeyError(
        f"the page-token key from {source} is malformed: give 64 hex characters or base64url of at least "
        f"{KEY_BYTES} bytes"
    )


def default_key_path(db_path: str | os.PathLike[str]) -> Path:
    """Where the key lives by default: ``throughline-token.key`` beside the DuckDB file."""
    return Path(db_path).absolute().parent / KEY_FILE_NAME


def read_key_file(path: str | os.PathLike[str]) -> bytes:
    """Read a key file; ``TokenKeyError`` when it is missing, unreadable or malformed."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(_MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise TokenKeyError(f"cannot read the page-token key file {path}: {exc.strerror or exc}") from None
    if len(raw) > _MAX_KEY_FILE_BYTES:
        raise TokenKeyError(f"the page-token key file {path} is too large to be a key")
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise TokenKeyError(f"the page-token key file {path} is malformed (not ASCII)") from None
    return parse_token_key(text, source=f"file {path}")


def load_or_create_key(path: str | os.PathLike[str]) -> bytes:
    """The key stored at ``path``, creating it once (atomically, mode 0600) when it does not exist."""
    target = Path(path)
    if target.exists():
        return _read_complete(target)
    key = secrets.token_bytes(KEY_BYTES)
    content = (key.hex() + "\n").encode("ascii")
    try:
        won = _create_linked(target, content)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise _unavailable(target, exc) from None
        won = _create_exclusive(target, content)  # no hard links here
    return key if won else _read_complete(target)


def resolve_token_key(
    *,
    db_path: str | os.PathLike[str] | None,
    key_file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> bytes:
    """The page-token key by the documented order: variable, then key file, then the default file."""
    env = os.environ if environ is None else environ
    inline = env.get(ENV_TOKEN_KEY)
    if inline:
        return parse_token_key(inline, source=f"${ENV_TOKEN_KEY}")
    explicit = key_file or env.get(ENV_TOKEN_KEY_FILE)
    if explicit:
        return read_key_file(explicit)
    if db_path is None:
        raise TokenKeyError(
            f"no page-token key: set {ENV_TOKEN_KEY}, pass --token-key-file or set {ENV_TOKEN_KEY_FILE}, "
            "or give the projection file (--db) so the key can live beside it"
        )
    return load_or_create_key(default_key_path(db_path))


def _unavailable(path: Path, exc: OSError) -> TokenKeyError:
    return TokenKeyError(
        f"cannot create the page-token key file {path} ({exc.strerror or exc}); set {ENV_TOKEN_KEY} or "
        f"{ENV_TOKEN_KEY_FILE} (or --token-key-file), or make the projection's directory writable"
    )


def _create_linked(target: Path, content: bytes) -> bool:
    """Write a temporary file and hard-link it to ``target``; ``False`` when another process won."""
    temp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            write_fully(fd, content)
        finally:
            os.close(fd)
        try:
            os.link(temp, target)
        except FileExistsError:
            return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
    sync_directory(target.parent)
    return True


def _create_exclusive(target: Path, content: bytes) -> bool:
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    except OSError as exc:
        raise _unavailable(target, exc) from None
    try:
        write_fully(fd, content)
    finally:
        os.close(fd)
    sync_directory(target.parent)
    return True


def _read_complete(target: Path) -> bytes:
    """Read ``target``, waiting (bounded) while a creator without hard links is still writing it."""
    deadline = time.monotonic() + _CONVERGE_WAIT_S
    while True:
        try:
            return read_key_file(target)
        except TokenKeyError:
            try:
                partial = target.stat().st_size < 64
            except OSError:
                partial = False
            if not partial or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)
