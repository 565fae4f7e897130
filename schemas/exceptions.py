"""Errors of the log's record encoding."""

from __future__ import annotations

from throughline.errors import ThroughlineError


class RecordDecodeError(ThroughlineError):
    """A topic record's bytes are not a throughline turn record (bad header, truncated, bad UTF-8)."""

    code = "record_undecodable"


class UnknownSchemaError(RecordDecodeError):
    """A record names a writer schema (by fingerprint) that this reader does not know."""

    code = "unknown_schema"


class UnknownSchemaIdError(UnknownSchemaError):
    """A registry-framed record names a schema id that the registry does not hold, that names a schema
    this reader does not know, or that cannot be looked up because no registry is configured.

    Quarantined like an unknown fingerprint (same code): it never blocks other projects."""


class RegistryError(ThroughlineError):
    """The schema registry answered with an error (a refused credential, a malformed answer)."""

    code = "registry_error"


class RegistryUnavailableError(RegistryError):
    """The schema registry did not answer within the bounded time, or answered 5xx: retry later."""

    code = "registry_unavailable"
    retriable = True


class SchemaIncompatibleError(RegistryError):
    """The registry's compatibility check refused a schema for the subject: nothing was sent."""

    code = "schema_incompatible"
    exit_code = 2
