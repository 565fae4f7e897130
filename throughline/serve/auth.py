"""Bearer-token authentication of the HTTP API.

Off by default on a loopback address (only local processes reach it), required on any other address:
``serve`` refuses to bind elsewhere without a token. The token comes from ``--auth-token-file`` or the
``THROUGHLINE_AUTH_TOKEN`` variable; clients send ``Authorization: Bearer <token>``. Tokens are compared
in constant time, and neither the token nor the header ever appears in a log line or an error message.

That token is the admin's. Scoped tokens (``serve --token-keys``, ``throughline.serve.tokens``) are
checked here too: ``BearerAuth.check`` returns the request's ``Grant``, and the routes refuse what
its scope does not cover (docs/security.md).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
from collections.abc import Mapping
from pathlib import Path

from throughline.serve.exceptions import AuthTokenRequiredError, InvalidAuthTokenError, UnauthorizedError
from throughline.serve.tokens import ADMIN, Grant, VerifiedTokens
from throughline.serve.tokens import VERSION as TOKEN_VERSION

ENV_AUTH_TOKEN = "THROUGHLINE_AUTH_TOKEN"
MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 4096
# Visible ASCII without spaces: it must travel in one header value and be typed into a secret store.
_TOKEN = re.compile(r"^[\x21-\x7e]+\Z")
_BEARER = re.compile(r"^[Bb][Ee][Aa][Rr][Ee][Rr] +([\x21-\x7e]+) *\Z")


def validate_token(token: str, *, origin: str) -> str:
    """Return ``token`` when it is usable, else raise ``InvalidAuthTokenError`` naming ``origin``."""
    if not token:
        raise InvalidAuthTokenError(f"the auth token from {origin} is empty")
    if len(token) > MAX_TOKEN_CHARS or not _TOKEN.match(token):
        raise InvalidAuthTokenError(
            f"the auth token from {origin} must be one word of visible ASCII characters, at most {MAX_TOKEN_CHARS}"
        )
    if len(token) < MIN_TOKEN_CHARS:
        raise InvalidAuthTokenError(
            f"the auth token from {origin} is shorter than {MIN_TOKEN_CHARS} characters; "
            "use a random one, e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
        )
    return token


def load_auth_token(token_file: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The bearer token from ``token_file`` (surrounding whitespace dropped) or ``THROUGHLINE_AUTH_TOKEN``.

    Returns ``None`` when neither is given. A file that cannot be read, or a token that is empty or not
    header-safe, is an ``InvalidAuthTokenError``.
    """
    env = os.environ if environ is None else environ
    if token_file:
        try:
            text = Path(token_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidAuthTokenError(
                f"cannot read the auth token file {token_file}: {exc.__class__.__name__}"
            ) from None
        return validate_token(text.strip(), origin=f"file {token_file}")
    raw = env.get(ENV_AUTH_TOKEN)
    if raw is None or raw == "":
        return None
    return validate_token(raw.strip(), origin=ENV_AUTH_TOKEN)


def is_loopback(host: str) -> bool:
    """True when ``host`` names only this machine (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything, so it is treated as exposed


def require_token_off_loopback(host: str, token: str | None, *, scoped: bool = False) -> None:
    """Refuse to expose the API beyond this machine without authentication (``scoped``: ``--token-keys``)."""
    if token is None and not scoped and not is_loopback(host):
        raise AuthTokenRequiredError(
            f"serve binds {host}, which is not a loopback address: set an auth token with "
            f"--auth-token-file FILE or {ENV_AUTH_TOKEN}, or scoped tokens with --token-keys PATH"
        )


class BearerAuth:
    """Checks the ``Authorization`` header of a request: the admin token, or a scoped token.

    ``token``: the ``--auth-token-file`` token, which grants ``admin``; ``verifier``: the scoped tokens
    of ``--token-keys`` (``throughline.serve.tokens``). With neither, every request is an admin (a
    loopback-only ``serve``). ``check`` returns the request's ``Grant``.
    """

    def __init__(self, token: str | None, verifier: VerifiedTokens | None = None) -> None:
        self._token = token.encode("ascii") if token is not None else None
        self._verifier = verifier

    @property
    def enabled(self) -> bool:
        """True when requests must carry a token."""
        return self._token is not None or self._verifier is not None

    def check(self, authorization: str | None) -> Grant:
        """The request's grant; ``UnauthorizedError`` (or a token error, all 401) when it has none."""
        if not self.enabled:
            return ADMIN
        if not authorization:
            raise UnauthorizedError("missing bearer token: send `Authorization: Bearer <token>`")
        m = _BEARER.match(authorization)
        if m is None:
            raise UnauthorizedError("the Authorization header is not `Bearer <token>`")
        presented = m.group(1)
        if self._token is not None and hmac.compare_digest(presented.encode("ascii"), self._token):
            return ADMIN
        if self._verifier is not None and presented.startswith(TOKEN_VERSION + "."):
            return self._verifier.grant(presented)
        raise UnauthorizedError("wrong bearer token")
