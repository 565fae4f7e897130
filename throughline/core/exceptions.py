"""Errors of the pure core (identity, chain, cursor, page token, page range, group data)."""

from __future__ import annotations

from throughline.errors import InputError, InvalidArgumentsError, ThroughlineError


class InvalidProjectError(InputError):
    """The project name is empty, too long or not representable."""

    code = "invalid_project"


class InvalidTurnError(InputError):
    """A turn's fields break the rules (missing, wrong type, too large, bad time)."""

    code = "invalid_turn"


class BodyTooLargeError(InvalidTurnError):
    """A turn's body is larger than the log accepts."""

    code = "body_too_large"


class InvalidLimitError(InputError):
    """``limit`` is not an integer in 1..100."""

    code = "invalid_limit"


class InvalidCursorError(InputError):
    """A cursor string is not a well-formed throughline cursor of a known shape."""

    code = "invalid_cursor"


class PageTokenError(InputError):
    """A page token is refused; the subclass (its ``code``) says why."""

    code = "invalid_page_token"


class PageTokenMalformedError(PageTokenError):
    """A page token that is not one: not a string, not the format, a payload that is not the schema."""

    code = "page_token_malformed"


class PageTokenOversizeError(PageTokenError):
    """A page token longer than the bound."""

    code = "page_token_oversize"


class PageTokenVersionError(PageTokenError):
    """A page token of another version or schema version."""

    code = "page_token_version"


class PageTokenTamperedError(PageTokenError):
    """A page token whose signature does not verify."""

    code = "page_token_tampered"


class PageTokenMismatchError(PageTokenError):
    """A page token of another project, after cursor or through cursor."""

    code = "page_token_mismatch"


class PageTokenOffsetError(PageTokenError):
    """A page token whose offset does not fit the series it is bound to."""

    code = "page_token_offset"


class InvalidRepairError(InputError):
    """A repair cannot be built: its source or reason breaks the rules (the subclass says which)."""

    code = "invalid_repair"


class InvalidSourceError(InvalidRepairError):
    """A repair's source cannot be named so: not a 32-byte hash (64 hexadecimal characters), or a host
    or thread that cannot name a source."""

    code = "invalid_source"


class InvalidReasonError(InvalidRepairError):
    """A repair's reason is blank, holds NUL or is too long."""

    code = "invalid_reason"


class RepairArgumentsError(InvalidArgumentsError, InvalidRepairError):
    """A repair names its source both ways, or half of one (``invalid_arguments``, a repair error too)."""


class GroupDataError(ThroughlineError):
    """A group member's subscription or an owner map (the user data of Kafka's group protocol) cannot be
    read: ``group_data_version`` (another schema version) or ``group_data_malformed``.

    Not an input error: the bytes come from another member of the group, not from the caller.
    """

    code = "group_data_malformed"


class GroupDataVersionError(GroupDataError):
    """Group data of another schema version (another throughline in the group)."""

    code = "group_data_version"
