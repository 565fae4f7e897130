"""The read wire ``throughline.observer_read.v1`` (docs/spec.md#read-wire) as pydantic models.

Field names are the camelCase names of docs/spec.md#read-wire, so the Python attributes and the JSON keys agree
(``schema`` is the one alias, because pydantic reserves the attribute). The committed JSON Schema
``schemas/observer_read.v1.schema.json`` is generated from these models::

    python -m throughline.reader.wire > schemas/observer_read.v1.schema.json

A document carries only the listed fields. ``ObserverRead.reason`` (why a read was pending or needs a
resync, for a person) lives on the Python object only and never reaches the JSON.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SCHEMA = "throughline.observer_read.v1"
STATUS_OK = "ok"
STATUS_PENDING = "projection_pending"
STATUS_RESYNC = "resync_required"
ReadStatus = Literal["ok", "projection_pending", "resync_required"]

_HEX64 = r"^[0-9a-f]{64}$"
_RFC3339_UTC = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z$"
_MAX_SAFE_INTEGER = 2**53 - 1

_CONFIG = ConfigDict(
    frozen=True,
    extra="forbid",
    populate_by_name=True,
    json_schema_serialization_defaults_required=True,
)


class ThreadIdentity(BaseModel):
    """Hash-only identity of the source (host, thread) whose turns a series serves."""

    model_config = _CONFIG

    sourceSha256: str = Field(pattern=_HEX64, description="SHA-256 source identity (no raw host or thread)")


class TurnRecordWire(BaseModel):
    """One completed turn as the Observer sees it; a body cut to the bound keeps its record."""

    model_config = _CONFIG

    seq: int = Field(ge=1, le=_MAX_SAFE_INTEGER, description="position of the turn in its thread's chain")
    completedAt: str = Field(pattern=_RFC3339_UTC, description="completion time, UTC, microseconds")
    body: str = Field(description="UTF-8 text, cut at a character boundary to the body bound")
    bodyBytes: int = Field(ge=0, description="full length of the body in UTF-8 bytes")
    bodyTruncated: bool = Field(description="true when body was cut to the bound")
    contentDigest: str = Field(pattern=_HEX64, description="SHA-256 over the turn's canonical content")
    chainDigest: str = Field(pattern=_HEX64, description="d(seq) of the turn's chain")


class PageWire(BaseModel):
    """Where a page stands in its series."""

    model_config = _CONFIG

    complete: bool
    nextToken: str | None = Field(max_length=4096)

    @model_validator(mode="after")
    def _token_iff_incomplete_or_not_ok(self) -> PageWire:
        if self.complete and self.nextToken is not None:
            raise ValueError("a complete page has no next token")
        return self


class ObserverRead(BaseModel):
    """One page of a read series, or the reason there is none (``projection_pending``, ``resync_required``)."""

    model_config = ConfigDict(**_CONFIG, title="throughline.observer_read.v1")

    schema_: Literal["throughline.observer_read.v1"] = Field(default="throughline.observer_read.v1", alias="schema")
    status: ReadStatus
    thread: ThreadIdentity | None
    afterCursor: str | None
    throughCursor: str | None
    turns: tuple[TurnRecordWire, ...]
    historyTruncated: bool
    page: PageWire
    reason: str = Field(default="", exclude=True)

    @model_validator(mode="after")
    def _status_invariants(self) -> ObserverRead:
        if self.status != STATUS_OK:
            if self.turns or self.page.complete or self.page.nextToken is not None or self.historyTruncated:
                raise ValueError(f"a {self.status} read has no turns, no token and an incomplete page")
        elif not self.page.complete and self.page.nextToken is None:
            raise ValueError("an incomplete ok page carries the next token")
        seqs = [t.seq for t in self.turns]
        if any(b != a + 1 for a, b in zip(seqs, seqs[1:], strict=False)):
            raise ValueError("turns are consecutive and in order")
        return self

    @property
    def ok(self) -> bool:
        """True when the page holds the turns it was asked for."""
        return self.status == STATUS_OK

    def to_json(self) -> str:
        """The wire document (exactly docs/spec.md#read-wire's fields, camelCase)."""
        return self.model_dump_json(by_alias=True)

    def to_json_bytes(self) -> bytes:
        """``to_json()`` as UTF-8 bytes, serialised straight to bytes (what an HTTP answer sends)."""
        return self.__pydantic_serializer__.to_json(self, by_alias=True)

    def to_dict(self) -> dict[str, Any]:
        """The wire document as plain JSON values."""
        return self.model_dump(mode="json", by_alias=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> ObserverRead:
        """Parse and validate a wire document."""
        return cls.model_validate_json(text)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of ``throughline.observer_read.v1`` (what ``schemas/`` commits)."""
    schema = ObserverRead.model_json_schema(by_alias=True, mode="serialization")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA, **schema}


def json_schema_text() -> str:
    """The committed file's exact text."""
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":  # pragma: no cover
    sys.stdout.write(json_schema_text())
