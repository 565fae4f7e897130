"""Errors of the reader, the token key and the reference Observer."""

from __future__ import annotations

from throughline.errors import ConfigurationError, InputError, Interrupted, ThroughlineError


class PageTokenUnboundError(InputError):
    """A page token was sent without the through cursor it is bound to (docs/spec.md#page-token-binding)."""

    code = "page_token_unbound"


class InvalidBodyLimitError(InputError):
    """The body bound is not an integer >= 0."""

    code = "invalid_body_limit"


class InvalidWaitError(InputError):
    """The projector wait is not a finite number of seconds >= 0."""

    code = "invalid_wait"


class InvalidResyncPolicyError(InputError):
    """The Observer's policy on ``resync_required`` is not ``snapshot`` or ``fail``."""

    code = "invalid_resync_policy"


class InvalidBackoffError(InputError):
    """The Observer's backoff is not > 0 and <= its maximum, or its pending wait is below 0."""

    code = "invalid_backoff"


class SourceQuarantinedError(ThroughlineError):
    """A cursor names a source with a quarantined record: the projection cannot vouch for its chain.

    Not an input error (the caller sent nothing wrong) and not retriable: an operator must look at the
    quarantine (``throughline status``).
    """

    code = "source_quarantined"


class TokenKeyError(ConfigurationError):
    """No page-token key could be found or created, or the configured one is malformed."""

    code = "token_key_unavailable"


class ObserverStateError(InputError):
    """The Observer's state file exists but is not a ``throughline.observer_state.v1`` document."""

    code = "invalid_observer_state"


class ObserverStateWriteError(ThroughlineError):
    """The Observer could not save its state file durably (the old cursor stays)."""

    code = "observer_state_unwritable"


class AuditFailedError(ThroughlineError):
    """The audit step refused a turn; the series is abandoned and the old cursor stays."""

    code = "audit_failed"


class ProjectionPendingError(ThroughlineError):
    """The Observer waited as long as it may for the projector and gave up; the old cursor stays."""

    code = "projection_pending"
    retriable = True


class ResyncRequiredError(ThroughlineError):
    """The reader answered ``resync_required`` and the Observer's policy is to stop; the old cursor stays."""

    code = "resync_required"


class ObserverProtocolError(ThroughlineError):
    """The reader broke the series protocol (for example, another through cursor mid-series)."""

    code = "observer_protocol_error"


class ObserverInterrupted(Interrupted):
    """A stop was requested mid-series; the series is abandoned and the old cursor stays."""
