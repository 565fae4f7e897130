"""Project and source identity: canonical forms and the hashes that stand for them.

Canonical project form (documented in docs/design.md):

1. Unicode NFC normalisation (so the same name typed on macOS and Linux is one project).
2. If the name contains ``/`` it is treated as a path and normalised lexically: repeated slashes and
   ``.`` segments collapse, ``..`` is resolved, and there is no trailing slash (``/`` alone stays ``/``).
   Nothing touches the file system: a project is a name, not a directory that must exist.
3. Surrounding whitespace is *not* stripped: ``" a"`` and ``"a"`` are two projects, because stripping
   would merge names a host chose on purpose.

``project_sha256 = SHA-256(UTF-8(canonical))``. A source is one (host, thread) pair inside a project;
its identity is a hash over the project hash and the length-prefixed host and thread names, so no raw
name can be read back from it.
"""

from __future__ import annotations

import hashlib
import posixpath
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from throughline.core.exceptions import InvalidProjectError, InvalidTurnError

MAX_PROJECT_CHARS = 4096
MAX_NAME_CHARS = 1024
_SOURCE_DOMAIN = b"throughline.source.v1\x00"


def canonical_project(project: str) -> str:
    """Return the canonical form of a project name (see the module docstring)."""
    if not isinstance(project, str):
        raise InvalidProjectError("project must be a string")
    return _canonical(project)


@lru_cache(maxsize=4096)
def _canonical(project: str) -> str:
    # Cached: the projector checks every record's project, and a log holds few distinct projects.
    # (lru_cache does not cache exceptions, so invalid names are re-checked and re-raised each time.)
    text = unicodedata.normalize("NFC", project)
    if "/" in text:
        text = posixpath.normpath(text)
        if text.startswith("//"):
            # POSIX keeps a leading '//' as implementation-defined; we fold it to one slash.
            text = "/" + text.lstrip("/")
    if not text or text == ".":
        raise InvalidProjectError("project must not be empty")
    if len(text) > MAX_PROJECT_CHARS:
        raise InvalidProjectError(f"project is longer than {MAX_PROJECT_CHARS} characters")
    if "\x00" in text:
        raise InvalidProjectError("project must not contain NUL")
    _require_encodable(text, "project", InvalidProjectError)
    return text


def project_sha256(project: str) -> bytes:
    """SHA-256 of the UTF-8 bytes of the canonical project name (32 raw bytes)."""
    return _project_hash(canonical_project(project))


@lru_cache(maxsize=4096)
def _project_hash(canonical: str) -> bytes:
    return hashlib.sha256(canonical.encode("utf-8")).digest()


def validate_name(value: object, field: str) -> str:
    """Check a host, thread or turn id: a non-empty string of at most 1024 characters, no NUL."""
    if not isinstance(value, str) or not value:
        raise InvalidTurnError(f"{field} must be a non-empty string")
    if len(value) > MAX_NAME_CHARS:
        raise InvalidTurnError(f"{field} is longer than {MAX_NAME_CHARS} characters")
    if "\x00" in value:
        raise InvalidTurnError(f"{field} must not contain NUL")
    _require_encodable(value, field, InvalidTurnError)
    return value


def _require_encodable(text: str, field: str, error: type[InvalidTurnError | InvalidProjectError]) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates cannot be stored or hashed
        raise error(f"{field} is not valid Unicode text") from None


def _framed(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + data


def source_sha256(project_hash: bytes, host: str, thread: str) -> bytes:
    """The hash-only identity of one (host, thread) pair within a project (32 raw bytes)."""
    if len(project_hash) != 32:
        raise ValueError("project_hash must be 32 bytes")
    return hashlib.sha256(
        _SOURCE_DOMAIN + project_hash + _framed(host.encode("utf-8")) + _framed(thread.encode("utf-8"))
    ).digest()


@dataclass(frozen=True, slots=True)
class SourceKey:
    """One source: the project's hash and the source's hash (no raw names)."""

    project_sha256: bytes
    source_sha256: bytes

    @classmethod
    def of(cls, project: str, host: str, thread: str) -> SourceKey:
        """Build the key of (project, host, thread)."""
        p = project_sha256(project)
        return cls(p, source_sha256(p, validate_name(host, "host"), validate_name(thread, "thread")))
