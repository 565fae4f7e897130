"""Errors of the pure core (identity, chain, cursor, page token, page range, group data)."""

from __future__ import annotations

from throughline.errors import InputError, ThroughlineError


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
    """A page token is refused; ``code`` says why."""

    code = "invalid_page_token"


class InvalidRepairError(InputError):
    """A repair cannot be built: its source or reason breaks the rules (``code`` says which)."""

    code = "invalid_repair"


class GroupDataError(ThroughlineError):
    """A group member's subscription or an owner map (the user data of Kafka's group protocol) cannot be
    read: ``group_data_version`` (another schema version) or ``group_data_malformed``.

    Not an input error: the bytes come from another member of the group, not from the caller.
    """

    code = "group_data_malformed"


class SnapshotMovedError(ThroughlineError):
    """A view that reads without a transaction (a quiet view) saw a commit land while it read: its answers
    may be of two versions. The reader catches it and reads the page again in a snapshot; it never
    reaches a caller."""

    code = "snapshot_moved"
    retriable = True
