"""The resume state of an ingest run: which line of which file the broker has acknowledged up to.

The ingest state file (not the Observer state file of ``reader/observer``) records the file identity
(device, inode), the byte offset after, the number of, and the byte range and SHA-256 of, the last line
covered by the state. It is written atomically and durably
(temp file, fsync, rename, fsync of the folder) only after the broker acknowledged every turn it covers.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from throughline.durable import replace_file
from throughline.producers.exceptions import IngestStateError
from throughline.producers.ingest.jsonl import field_errors

INGEST_STATE_SCHEMA = "throughline.ingest_state.v1"
INGEST_STATE_SUFFIX = ".ingest-state"


@dataclass(frozen=True, slots=True)
class FileId:
    """A file's identity on disk (what ``tail -F`` compares to notice a rotation)."""

    device: int
    inode: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileId:
        """The identity of a stat result."""
        return cls(st.st_dev, st.st_ino)


@dataclass(frozen=True, slots=True)
class IngestState:
    """Where a resumed ingest starts: right after line ``line`` ending at byte ``offset`` of file ``file``.

    ``line_start`` and ``line_sha256`` (the byte range and SHA-256 of that line's text) let a resume check
    that the file still holds that line where the state says, so a file rewritten in place while ingest
    was stopped (``logrotate copytruncate``, an editor) is read again from 0 instead of being skipped.
    """

    file: FileId
    offset: int
    line: int
    line_start: int | None = None
    line_sha256: bytes | None = None
    #: Host formats: the lines after which the parser was settled and what it returned was acknowledged
    #: (a re-read from line 1 settles it there again, so it reads on as the run that sent them did).
    settled: tuple[int, ...] = ()
    #: Whether the parser was settled after ``line`` too (a file that did not grow since needs no settle).
    settled_end: bool = False
    #: Host formats: the version of the parser whose turns the state covers (``SessionParser.version``;
    #: ``None``: a state written before parsers had versions, or a JSON Lines file).
    parser_version: int | None = None


class _FileDoc(BaseModel):
    """One file's place: the fields an ``IngestState`` is made of, as both state documents write them."""

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True, populate_by_name=True)

    device: int = Field(ge=0)
    inode: int = Field(ge=0)
    offset: int = Field(ge=0)
    line: int = Field(ge=0)
    line_start: int | None = Field(default=None, ge=0, alias="lineStart")
    line_sha256: str | None = Field(default=None, pattern="^[0-9a-f]{64}$", alias="lineSha256")
    settled: list[int] = Field(default_factory=list)
    settled_end: bool = Field(default=False, alias="settledEnd")
    parser_version: int | None = Field(default=None, ge=0, alias="parserVersion")

    def state(self) -> IngestState:
        """The ``IngestState`` this document holds."""
        digest = bytes.fromhex(self.line_sha256) if self.line_sha256 else None
        return IngestState(
            FileId(self.device, self.inode),
            self.offset,
            self.line,
            self.line_start,
            digest,
            tuple(self.settled),
            self.settled_end,
            self.parser_version,
        )


def _file_doc(state: IngestState) -> dict[str, object]:
    """The JSON fields of ``state`` (the inverse of ``_FileDoc.state``)."""
    return {
        "device": state.file.device,
        "inode": state.file.inode,
        "offset": state.offset,
        "line": state.line,
        "lineStart": state.line_start,
        "lineSha256": state.line_sha256.hex() if state.line_sha256 else None,
        # written only when set: a JSON Lines state never has them, and older readers ignore them
        **({"settled": list(state.settled)} if state.settled else {}),
        **({"settledEnd": True} if state.settled_end else {}),
        **({"parserVersion": state.parser_version} if state.parser_version is not None else {}),
    }


class _StateDoc(_FileDoc):
    schema_: str = Field(alias="schema")


_Doc = TypeVar("_Doc", bound=BaseModel)


def _read_doc(state_path: str, model: type[_Doc], what: str, *, limit: int = -1) -> _Doc | None:
    """The document of ``model`` in ``state_path``; ``None`` when the file does not exist. A damaged
    file raises ``IngestStateError`` (never silently ignored: starting over would send everything again)."""
    try:
        with open(state_path, "rb") as f:
            text = f.read(limit)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise IngestStateError(f"cannot read ingest state {state_path}: {exc.strerror}") from None
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        raise IngestStateError(f"{state_path} is not {what} ({field_errors(exc)})") from None


def _check_schema(state_path: str, schema: str, expected: str) -> None:
    if schema != expected:
        raise IngestStateError(f"{state_path} has schema {schema!r}; expected {expected!r}")


def _write_doc(state_path: str, doc: dict[str, object]) -> None:
    """Write ``doc`` (stamped with ``savedAt``) atomically and durably: temp file, fsync, rename over,
    fsync of the folder."""
    doc = {**doc, "savedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    replace_file(state_path, (json.dumps(doc, sort_keys=True) + "\n").encode())


def default_ingest_state_path(path: str) -> str:
    """The ingest state file of a followed file when ``--state`` is not given."""
    return path + INGEST_STATE_SUFFIX


def load_ingest_state(state_path: str) -> IngestState | None:
    """Read an ingest state file; ``None`` when it does not exist. A damaged file raises ``IngestStateError``
    (never silently ignored: starting over would send the whole file again)."""
    doc = _read_doc(state_path, _StateDoc, "an ingest state file", limit=64 * 1024)
    if doc is None:
        return None
    _check_schema(state_path, doc.schema_, INGEST_STATE_SCHEMA)
    return doc.state()


def save_ingest_state(state_path: str, state: IngestState, *, source_path: str | None = None) -> None:
    """Write the state atomically and durably: temp file, fsync, rename over, fsync of the folder."""
    path = os.path.abspath(source_path) if source_path else None
    _write_doc(state_path, {"schema": INGEST_STATE_SCHEMA, "path": path, **_file_doc(state)})


# ------------------------------------------------------------------------------------------------ many files

SESSIONS_STATE_SCHEMA = "throughline.ingest_sessions_state.v1"


class _SessionsDoc(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", strict=True, populate_by_name=True)

    schema_: str = Field(alias="schema")
    format: str
    files: dict[str, _FileDoc]


def load_session_states(state_path: str, *, format: str) -> dict[str, IngestState]:
    """The per-file states of a host-format ingest (path -> state); empty when the file does not exist.

    A damaged file, or one written for another format, raises ``IngestStateError``.
    """
    doc = _read_doc(state_path, _SessionsDoc, "a session ingest state file")
    if doc is None:
        return {}
    _check_schema(state_path, doc.schema_, SESSIONS_STATE_SCHEMA)
    if doc.format != format:
        raise IngestStateError(f"{state_path} is the state of --format {doc.format}, not {format}")
    return {path: f.state() for path, f in doc.files.items()}


def save_session_states(state_path: str, states: dict[str, IngestState], *, format: str) -> None:
    """Write the per-file states of a host-format ingest atomically and durably."""
    files = {path: _file_doc(st) for path, st in sorted(states.items())}
    _write_doc(state_path, {"schema": SESSIONS_STATE_SCHEMA, "format": format, "files": files})
