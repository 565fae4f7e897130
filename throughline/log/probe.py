"""One connection to a bootstrap server before a client is built: does the listener accept these settings?

kafka-python retries a connection that fails its TLS handshake or its SASL login until the bootstrap
timeout and then reports only "Unable to bootstrap" (and kafka-python 3.0 drops the broker's
authentication-failure answer when the broker closes right after it). So before the Kafka edge builds a
client it opens one connection itself, the way the client would, and says exactly what is wrong:

1. TCP to the first bootstrap server that accepts (none does: nothing to say, the client's own retries
   and ``broker_unavailable`` take over);
2. with ``SSL``/``SASL_SSL``, the TLS handshake with the client's own ``SSLContext``: an untrusted
   certificate, a host-name mismatch, a listener that does not speak TLS;
3. a ``SaslHandshake`` request (api key 17, v1): a SASL listener answers with its mechanisms, any other
   listener with ``ILLEGAL_SASL_STATE``; a TLS listener sent plain text answers with a TLS alert or
   closes. That tells a SASL listener from a plain one, both ways. A close is only called TLS when a
   second connection completes (or is refused by) a TLS handshake: a broker that is starting or
   stopping accepts connections and closes them too, and that is a retriable outage, not a setting;
4. with SASL, the login itself through kafka-python's own mechanism (``SaslAuthenticate``, api key
   36, v0): a wrong user name or password.

Every step is bounded by the caller's deadline; a step that times out decides nothing (the client then
tries, within what is left of the deadline). The probe sends no record and joins no group.
"""

from __future__ import annotations

import socket
import ssl
import struct
import time
from collections.abc import Sequence

from throughline.log.config import KafkaClientConfig
from throughline.log.exceptions import (
    AuthenticationFailedError,
    CertificateRefusedError,
    CertificateUntrustedError,
    HostnameMismatchError,
    KafkaSecurityError,
    ProtocolMismatchError,
    SaslMechanismUnsupportedError,
    TlsFailedError,
)

_SASL_HANDSHAKE = 17
_SASL_AUTHENTICATE = 36
_UNSUPPORTED_SASL_MECHANISM = 33
_ILLEGAL_SASL_STATE = 34
_SASL_AUTHENTICATION_FAILED = 58
#: OpenSSL's verify codes for a certificate that names another host or IP address.
_NAME_MISMATCH = {62, 64}
#: OpenSSL reasons meaning "the peer does not speak TLS" (it answered plain bytes, or closed).
_NOT_TLS = {
    "WRONG_VERSION_NUMBER",
    "RECORD_LAYER_FAILURE",
    "PACKET_LENGTH_TOO_LONG",
    "HTTP_REQUEST",
    "UNEXPECTED_EOF_WHILE_READING",
    "UNKNOWN_PROTOCOL",
}
_MAX_FRAME = 1 << 20


class _Undecided(Exception):
    """The probe could not tell (a timeout, a reset): the client itself decides."""


class _ClosedAtFirstRequest(Exception):
    """A plain-text listener closed the connection at the first request: TLS, or a broker not yet serving."""


def split_server(server: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) as a (host, port) pair; the default port is 9092."""
    host, sep, port = server.rpartition(":")
    if not sep or not port.isdigit() or (host.count(":") and not host.startswith("[")):
        host, port = server, "9092"
    return host.strip("[]"), int(port)


def check_listener(
    servers: Sequence[str],
    kafka_config: KafkaClientConfig,
    context: ssl.SSLContext | None,
    deadline: float,
) -> None:
    """Raise the ``KafkaSecurityError`` a client with these settings would meet; return when the
    listener accepts them or the probe could not tell (no server reachable, a timeout)."""
    for server in servers:
        host, port = split_server(server)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        try:
            sock = socket.create_connection((host, port), timeout=remaining)
        except OSError:
            continue  # the next server, or the client's own retries
        try:
            _check(sock, host, server, kafka_config, context, deadline)
        except _Undecided:
            pass
        except _ClosedAtFirstRequest:
            if _speaks_tls(host, port, deadline):
                raise _tls_to_plain_text(server, kafka_config) from None
        finally:
            sock.close()
        return


def _speaks_tls(host: str, port: int, deadline: float) -> bool:
    """Whether a new connection to ``host:port`` answers a TLS ClientHello with a TLS handshake.

    Nothing is verified (no certificate, no name): the question is only which protocol the port speaks.
    A refused connection, a close, a plain-text answer or a timeout is "no": the client then decides.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return False
    try:
        with socket.create_connection((host, port), timeout=remaining) as sock:
            with context.wrap_socket(sock, do_handshake_on_connect=False) as channel:
                channel.settimeout(max(0.001, deadline - time.monotonic()))
                channel.do_handshake()
    except ssl.SSLError as exc:
        # A TLS alert (say, "certificate required" from a listener that wants a client certificate)
        # is a TLS answer; an EOF or a plain-text reply is not.
        return not _not_tls(exc)
    except OSError:
        return False
    return True


def _check(
    sock: socket.socket,
    host: str,
    server: str,
    config: KafkaClientConfig,
    context: ssl.SSLContext | None,
    deadline: float,
) -> None:
    channel: socket.socket = sock
    if config.uses_tls:
        assert context is not None
        channel = _tls(sock, host, server, config, context, deadline)
    mechanism = config.sasl_mechanism or "PLAIN"
    code, mechanisms = _sasl_handshake(channel, server, config, mechanism, deadline)
    if code == _ILLEGAL_SASL_STATE:  # not a SASL listener
        if config.uses_sasl:
            raise ProtocolMismatchError(
                f"the listener at {server} does not use SASL but security.protocol is {config.security_protocol}"
                f"{_in(config)}: is it a PLAINTEXT or SSL listener? Check the port and security.protocol"
            )
        return
    if code not in (0, _UNSUPPORTED_SASL_MECHANISM):
        raise _Undecided(f"SaslHandshake answered error {code}")
    if not config.uses_sasl:
        raise ProtocolMismatchError(
            f"the listener at {server} requires SASL (mechanisms {', '.join(mechanisms) or 'unknown'}) but "
            f"security.protocol is {config.security_protocol}{_in(config)}"
        )
    if code == _UNSUPPORTED_SASL_MECHANISM:
        raise SaslMechanismUnsupportedError(
            f"the listener at {server} does not enable SASL mechanism {mechanism} (it enables "
            f"{', '.join(mechanisms) or 'none'}); check sasl.mechanism{_in(config)}"
        )
    _sasl_login(channel, host, server, config, deadline)


def _in(config: KafkaClientConfig) -> str:
    return f" in {config.source}" if config.source else ""


def _tls(
    sock: socket.socket, host: str, server: str, config: KafkaClientConfig, context: ssl.SSLContext, deadline: float
) -> ssl.SSLSocket:
    sock.settimeout(max(0.001, deadline - time.monotonic()))
    try:
        return context.wrap_socket(sock, server_hostname=host)
    except ssl.SSLCertVerificationError as exc:
        if exc.verify_code in _NAME_MISMATCH:
            raise HostnameMismatchError(
                f"the TLS certificate of {server} does not name {host} ({exc.verify_message}); connect by a name "
                f"the certificate holds, or set ssl.endpoint.identification.algorithm= (empty) to skip the "
                f"host-name check{_in(config)}"
            ) from None
        raise CertificateUntrustedError(
            f"the TLS certificate of {server} is not trusted ({exc.verify_message}); set ssl.ca.location to "
            f"the CA that signed it{_in(config)}"
        ) from None
    except ssl.SSLError as exc:
        raise _tls_failure(exc, server, config) from None
    except TimeoutError:
        raise _Undecided("TLS handshake timed out") from None
    except OSError as exc:  # reset or closed mid-handshake: the peer does not speak TLS
        raise ProtocolMismatchError(
            f"the listener at {server} closed the connection during the TLS handshake ({exc.strerror or exc}): "
            f"it does not speak TLS; check the port and security.protocol={config.security_protocol}{_in(config)}"
        ) from None


def _not_tls(exc: ssl.SSLError) -> bool:
    """Whether a failed handshake means the peer does not speak TLS (it closed, or answered plain bytes)."""
    reason = str(getattr(exc, "reason", "") or "")
    return isinstance(exc, ssl.SSLEOFError | ssl.SSLZeroReturnError) or reason in _NOT_TLS


def _tls_to_plain_text(server: str, config: KafkaClientConfig) -> ProtocolMismatchError:
    """A TLS listener reached with a plain-text ``security.protocol``."""
    return ProtocolMismatchError(
        f"the listener at {server} speaks TLS but security.protocol is {config.security_protocol}"
        f"{_in(config)}: use SSL or SASL_SSL (with ssl.ca.location), or the plain-text port"
    )


def _tls_failure(exc: ssl.SSLError, server: str, config: KafkaClientConfig) -> KafkaSecurityError:
    reason = str(getattr(exc, "reason", "") or "")
    if _not_tls(exc):
        return ProtocolMismatchError(
            f"the listener at {server} does not speak TLS ({reason or type(exc).__name__}); is it a PLAINTEXT "
            f"or SASL_PLAINTEXT listener? Check the port and security.protocol={config.security_protocol}{_in(config)}"
        )
    if "CERTIFICATE" in reason or "UNKNOWN_CA" in reason:
        return CertificateRefusedError(
            f"the broker at {server} refused the TLS handshake ({reason}): it wants a client certificate it "
            f"trusts; check ssl.certificate.location and ssl.key.location{_in(config)}"
        )
    return TlsFailedError(f"the TLS handshake with {server} failed ({reason or exc}){_in(config)}")


# ------------------------------------------------------------------------------------------ the wire


def _request(api_key: int, version: int, body: bytes) -> bytes:
    client = b"throughline-probe"
    header = struct.pack(">hhih", api_key, version, 1, len(client)) + client
    return struct.pack(">i", len(header) + len(body)) + header + body


def _read_exact(channel: socket.socket, n: int, deadline: float) -> bytes:
    data = bytearray()
    while len(data) < n:
        channel.settimeout(max(0.001, deadline - time.monotonic()))
        chunk = channel.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("closed")
        data += chunk
    return bytes(data)


def _exchange(channel: socket.socket, request: bytes, deadline: float) -> bytes:
    """Send one request, return the response body (after the correlation id)."""
    channel.settimeout(max(0.001, deadline - time.monotonic()))
    channel.sendall(request)
    head = _read_exact(channel, 4, deadline)
    size = struct.unpack(">i", head)[0]
    if head[:1] == b"\x15" or not 4 <= size <= _MAX_FRAME:
        raise _NotKafka(head)
    frame = _read_exact(channel, size, deadline)
    return frame[4:]


class _NotKafka(Exception):
    """The answer is not a Kafka response frame (its first bytes are kept)."""

    def __init__(self, head: bytes) -> None:
        super().__init__(head.hex())
        self.head = head


def _strings(data: bytes, at: int) -> list[str]:
    count = struct.unpack_from(">i", data, at)[0]
    at += 4
    out: list[str] = []
    for _ in range(max(0, min(count, 64))):
        n = struct.unpack_from(">h", data, at)[0]
        at += 2
        out.append(data[at : at + n].decode("utf-8", "replace"))
        at += n
    return out


def _sasl_handshake(
    channel: socket.socket, server: str, config: KafkaClientConfig, mechanism: str, deadline: float
) -> tuple[int, list[str]]:
    encoded = mechanism.encode()
    try:
        body = _exchange(channel, _request(_SASL_HANDSHAKE, 1, struct.pack(">h", len(encoded)) + encoded), deadline)
    except _NotKafka as exc:
        if not config.uses_tls and exc.head[:1] == b"\x15":
            raise _tls_to_plain_text(server, config) from None
        raise _Undecided("not a Kafka answer") from None
    except ssl.SSLError as exc:  # a TLS 1.3 server refuses a client certificate after the handshake
        raise _tls_failure(exc, server, config) from None
    except (TimeoutError, struct.error):
        raise _Undecided("no SaslHandshake answer") from None
    except OSError:
        if not config.uses_tls:
            # A TLS listener may close on plain text, but so does a broker that is still starting (or
            # stopping): its port accepts before it serves. Only a TLS handshake on a new connection
            # tells the two apart (``check_listener``).
            raise _ClosedAtFirstRequest() from None
        raise _Undecided("closed after TLS") from None
    code = struct.unpack_from(">h", body, 0)[0]
    return code, _strings(body, 2) if len(body) >= 6 else []


def _sasl_login(channel: socket.socket, host: str, server: str, config: KafkaClientConfig, deadline: float) -> None:
    from throughline.log.clients import sasl_mechanism

    mechanism = sasl_mechanism(config, host)
    for _ in range(8):  # PLAIN takes one round trip, SCRAM two
        if mechanism.is_done():
            break
        token = bytes(mechanism.auth_bytes())
        try:
            body = _exchange(channel, _request(_SASL_AUTHENTICATE, 0, struct.pack(">i", len(token)) + token), deadline)
        except (_NotKafka, TimeoutError, OSError, struct.error):
            raise _Undecided("no SaslAuthenticate answer") from None
        code = struct.unpack_from(">h", body, 0)[0]
        if code == _SASL_AUTHENTICATION_FAILED:
            raise AuthenticationFailedError(
                f"the broker at {server} refused the {config.label()} credentials; check sasl.username and "
                f"sasl.password (or sasl.jaas.config){_in(config)}"
            )
        if code != 0:
            raise _Undecided(f"SaslAuthenticate answered error {code}")
        at = 2
        n = struct.unpack_from(">h", body, at)[0]
        at += 2 + max(0, n)
        size = struct.unpack_from(">i", body, at)[0]
        answer = body[at + 4 : at + 4 + max(0, size)]
        try:
            mechanism.receive(answer)
        except Exception:  # a SCRAM server signature that does not verify
            raise AuthenticationFailedError(
                f"the broker at {server} answered the {config.label()} login with a signature that does not "
                f"verify{_in(config)}"
            ) from None
