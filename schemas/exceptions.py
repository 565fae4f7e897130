"""Errors of the log's record encoding."""

from __future__ import annotations

from throughline.errors import ThroughlineError


class RecordDecodeError(ThroughlineError):
    """A topic record's bytes are not a throughline turn record (bad header, truncated, bad UTF-8)."""

    code = "record_undecodable"


class UnknownSchemaError(RecordDecodeError):
    """A record names a writer schema (by fingerprint) that this reader does not know."""

    code = "unknown_schema"
