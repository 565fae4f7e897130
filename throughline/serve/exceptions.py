"""Errors of ``throughline serve`` (the HTTP read API) and of its client, ``HttpReader``.

Errors the HTTP API answers carry an ``http_status`` beside the usual ``code``/``retriable``/``exit_code``.
Hard input errors raised by the reader itself (``invalid_limit``, ``invalid_cursor``, ``page_token_*``...)
are not redefined here: the API returns them as 400 with their own codes, and ``HttpReader`` raises the
same classes again on the client side.
"""

from __future__ import annotations

from throughline.errors import ConfigurationError, InputError, InvalidArgumentsError, ThroughlineError


class ServeError(ThroughlineError):
    """Root of the errors of the HTTP service and its client."""

    code = "serve_error"


#: A request the API cannot take: unknown or repeated parameters, a body that is not a JSON object. The
#: CLI's argument error's class itself, because it is the same mistake made over HTTP.
InvalidRequestError = InvalidArgumentsError


class RequestTooLargeError(InputError):
    """A request body (413) or query string (414) is larger than the service accepts."""

    code = "request_too_large"


class EndpointNotFoundError(InputError):
    """A request for a path the API does not serve (HTTP 404)."""

    code = "not_found"


class MethodNotAllowedError(InputError):
    """A request with a method the path does not answer (HTTP 405)."""

    code = "method_not_allowed"


class HttpProtocolError(InputError):
    """Another refusal of the HTTP layer itself, answered with its own status."""

    code = "http_error"


class UnknownCodeError(ServeError):
    """A server answered with a code this client has no class for (a newer server).

    The one error whose ``code`` is its instance's, not its class's: the server's code, kept so the CLI
    prints what the server said. A 4xx answer (but 401) is the caller's (CLI exit code 2), and a 503
    answer retriable, as the status says.
    """

    def __init__(self, code: str, message: str, *, status: int) -> None:
        super().__init__(message, retriable=True if status == 503 else None)
        self.code = code  # type: ignore[misc]  # the server's code; every other code is its class's
        self.status = status
        if 400 <= status < 500 and status != 401:
            self.exit_code = 2


class UnauthorizedError(ServeError):
    """A request without the bearer token, or with the wrong one (HTTP 401)."""

    code = "unauthorized"


class ServerBusyError(ServeError):
    """Too many long-polls wait at once (HTTP 503); the same call may succeed a moment later."""

    code = "server_busy"
    retriable = True


class ServerUnavailableError(ServeError):
    """The client could not reach ``throughline serve`` (refused, timed out, reset)."""

    code = "server_unavailable"
    retriable = True


class BadResponseError(ServeError):
    """The server answered something that is not a throughline document (a proxy page, a wrong URL)."""

    code = "bad_response"


class AuthTokenRequiredError(ConfigurationError):
    """``serve`` was asked to bind a non-loopback address without a bearer token."""

    code = "auth_token_required"


class InvalidAuthTokenError(ConfigurationError):
    """The bearer token (file or variable) is empty, unreadable or not a single header-safe word."""

    code = "invalid_auth_token"


class ProjectorFailedError(ServeError):
    """The projector thread of ``serve`` stopped with an error; the service shuts down (exit 1)."""

    code = "projector_failed"


class RebuildRefusedError(ServeError):
    """A rebuild without downtime that cannot start (one runs, or this serve switched files already) or
    that failed (the live file keeps serving) (HTTP 409)."""

    code = "rebuild_refused"


class BindFailedError(ServeError):
    """``serve`` cannot resolve ``--host`` or listen on ``--host``/``--port``."""

    code = "bind_failed"


class ForwardFailedError(ServeError):
    """A member could not pass a read on to any member that holds its partition (none reachable in
    the time allowed). Retriable: the group rebalances, or the holders come back."""

    code = "forward_failed"
    retriable = True


class AlreadyForwardedError(ServeError):
    """A read that another member forwarded here would be forwarded again: one hop only, so that two
    members with different views of the group never pass a read back and forth."""

    code = "forward_loop"
    retriable = True


class InvalidGroupOptionError(InputError):
    """``serve --group``'s options do not make a member: no ``--advertise`` URL, one that is not an
    http(s) URL, ``--copies`` below 1, or ``--no-projector`` (a member projects its partitions)."""

    code = "invalid_group_option"


# -- scoped read tokens (docs/security.md)


class TokenMalformedError(UnauthorizedError):
    """A scoped token that is not one: wrong shape, bad base64, claims that are not the exact schema,
    longer than the bound (HTTP 401)."""

    code = "token_malformed"


class TokenSignatureError(UnauthorizedError):
    """A scoped token whose signature does not verify with the key its key id names: tampered with, or
    signed by another key under a borrowed key id (HTTP 401)."""

    code = "token_bad_signature"


class TokenUnknownKeyError(UnauthorizedError):
    """A scoped token signed by a key this server does not hold (never had, or retired) (HTTP 401)."""

    code = "token_unknown_key"


class TokenExpiredError(UnauthorizedError):
    """A scoped token past its expiry (HTTP 401); issue a new one."""

    code = "token_expired"


class TokenAudienceError(UnauthorizedError):
    """A scoped token issued for another audience (another deployment) (HTTP 401)."""

    code = "token_wrong_audience"


class ForbiddenError(ServeError):
    """A valid token whose scope does not allow this request (HTTP 403)."""

    code = "forbidden_scope"


class ForbiddenProjectError(ForbiddenError):
    """A read of a project outside the token's scope (HTTP 403). The answer is the same whether the
    project exists or not, and names no project."""

    code = "forbidden_project"


class InvalidTokenKeyError(ConfigurationError):
    """A token key file (``token keygen``'s) or key folder that cannot be read or is not one."""

    code = "invalid_token_key"


class InvalidTokenRequestError(InputError):
    """``token issue`` cannot make the token asked for: no project, a bad duration, too large."""

    code = "invalid_token_request"


# -- HTTPS


class TlsRequiredError(ConfigurationError):
    """``serve`` was asked to bind a non-loopback address in plain HTTP without ``--insecure-http``."""

    code = "tls_required"


class InvalidTlsOptionError(ConfigurationError):
    """A certificate, key or CA file that cannot be loaded, or TLS options that do not go together."""

    code = "invalid_tls_option"


class InvalidUrlError(ConfigurationError):
    """A client's ``--url`` that is not one or more http(s) URLs without a query or fragment."""

    code = "invalid_url"


class TlsVerifyError(ServeError):
    """The server's certificate was refused (a client, or a member forwarding a read). Not retriable:
    the certificate or the ``--ca`` is wrong, not the network."""

    code = "tls_verify_failed"


class TlsUntrustedError(TlsVerifyError):
    """The server's certificate is not signed by a trusted CA (``--ca`` / ``THROUGHLINE_CA``)."""

    code = "tls_untrusted_certificate"


class TlsExpiredError(TlsVerifyError):
    """The server's certificate has expired (or is not valid yet)."""

    code = "tls_certificate_expired"


class TlsHostnameError(TlsVerifyError):
    """The server's certificate does not name the host of the URL."""

    code = "tls_hostname_mismatch"


# -- projection snapshots


class SnapshotFetchError(ServeError):
    """``serve --bootstrap-from URL`` could not fetch a projection snapshot: the peer is unreachable, answered
    an error, or cut its answer short. ``serve`` then catches up from the log instead."""

    code = "snapshot_fetch_failed"
    retriable = True


class InvalidBootstrapUrlError(ConfigurationError):
    """``--bootstrap-from`` is not an http(s) URL."""

    code = "invalid_bootstrap_url"
