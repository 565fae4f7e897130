"""HTTPS and token-key upkeep for ``throughline serve`` and its clients (docs/security.md).

- ``server_context``: the TLS context ``serve --tls-cert F --tls-key F [--tls-client-ca F]`` listens
  with: TLS 1.2 at least (OpenSSL picks 1.3 whenever the client offers it), and with a client CA,
  mutual TLS (a client without a certificate that CA signed is refused in the handshake);
- ``client_context``: what a client (``--ca F`` / ``THROUGHLINE_CA``) or a group member forwarding a
  read verifies the server with: the CA file (else the system's trust store), the host name, TLS 1.2
  at least; a member also presents its own certificate, for members that require mutual TLS;
- ``require_tls_off_loopback``: plain HTTP beyond this machine only with ``--insecure-http``;
- ``KeyWatcher``: re-reads ``--token-keys`` on SIGHUP and whenever a file in it changes.
- ``RedactQuery``: the access log's filter: a request line without its query string.
"""

from __future__ import annotations

import logging
import signal
import ssl
import sys
import threading
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from throughline.serve.auth import is_loopback
from throughline.serve.exceptions import InvalidTlsOptionError, InvalidTokenKeyError, TlsRequiredError

if TYPE_CHECKING:
    from throughline.serve.tokens import KeyRing

_log = logging.getLogger("throughline.serve")

ENV_CA = "THROUGHLINE_CA"
#: How often the key watcher looks at ``--token-keys`` for a change.
KEY_POLL_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """``serve``'s certificate and key, the CA its clients must be signed by (mutual TLS), and the CA
    it verifies other members with when it forwards (``None``: the system's trust store)."""

    cert: str
    key: str
    client_ca: str | None = None
    peer_ca: str | None = None


def server_context(options: TlsOptions) -> ssl.SSLContext:
    """The listening socket's TLS context (``InvalidTlsOptionError`` for a file that does not load)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(options.cert, options.key)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidTlsOptionError(f"cannot load --tls-cert/--tls-key: {_reason(exc)}") from None
    if options.client_ca is not None:
        try:
            context.load_verify_locations(cafile=options.client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidTlsOptionError(f"cannot load --tls-client-ca: {_reason(exc)}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(ca: str | None, *, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    """A verifying client context: ``ca`` (else the system's CAs), the host name, TLS 1.2 at least;
    ``cert``/``key``: a client certificate for a server that requires mutual TLS."""
    try:
        context = ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidTlsOptionError(f"cannot load the CA file {ca}: {_reason(exc)}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        try:
            context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidTlsOptionError(f"cannot load the client certificate: {_reason(exc)}") from None
    return context


def _reason(exc: BaseException) -> str:
    return str(getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc.__class__.__name__)


def require_tls_off_loopback(host: str, tls: TlsOptions | None, insecure_http: bool) -> None:
    """Refuse plain HTTP on a non-loopback address unless ``--insecure-http`` says so."""
    if tls is None and not insecure_http and not is_loopback(host):
        raise TlsRequiredError(
            f"serve binds {host}, which is not a loopback address, in plain HTTP: tokens and turns would cross "
            "the network readable; give --tls-cert FILE --tls-key FILE, or --insecure-http (a TLS proxy in front)"
        )


class KeyWatcher:
    """Reloads a ``KeyRing`` on SIGHUP and when its files change, for the life of a ``with`` block.

    A reload that fails keeps the keys in use and logs why (a key folder half-copied must not lock
    every Observer out). The signal handler only wakes the watcher thread, which does the reading.
    """

    def __init__(self, ring: KeyRing, poll: float = KEY_POLL_SECONDS) -> None:
        self.ring = ring
        self._poll = poll
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._hup = False
        self._previous: Any = None
        self._thread = threading.Thread(target=self._run, name="throughline-token-keys", daemon=True)

    def _on_hup(self, _signum: int, _frame: FrameType | None) -> None:
        self._hup = True
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._poll)
            self._wake.clear()
            if self._stop.is_set():
                return
            forced, self._hup = self._hup, False
            try:
                if forced:
                    kids = self.ring.reload()
                    _log.warning("token keys reloaded on SIGHUP: key ids %s", ", ".join(kids))
                elif self.ring.reload_if_changed():
                    _log.warning("token keys reloaded (a file changed): key ids %s", ", ".join(self.ring.kids()))
            except InvalidTokenKeyError as exc:
                _log.error("token keys not reloaded, the previous keys stay in use: %s", exc.message)

    def __enter__(self) -> KeyWatcher:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGHUP, self._on_hup)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        if self._previous is not None:
            signal.signal(signal.SIGHUP, self._previous)
            self._previous = None


def redact_access_log() -> None:
    """uvicorn's access log (``serve --access-log``) without query strings, and on stderr as the CLI
    documents (uvicorn's default handler writes it to stdout, where ``serve`` prints only its URL)."""
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactQuery) for f in access.filters):
        access.addFilter(RedactQuery())
    for handler in access.handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout:
            handler.setStream(sys.stderr)


class RedactQuery(logging.Filter):
    """Drops the query string from uvicorn's access log lines: a read's query names its project and
    may carry cursors and page tokens, none of which belongs in a log."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the record's path argument without its query; never drops a record."""
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], args[2].split("?", 1)[0] + "?...", *args[3:])
        return True
