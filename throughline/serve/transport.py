"""One HTTP request to a ``throughline serve``, and the same request along a group's members.

Shared by the two clients of the read API: ``HttpReader`` (a library or CLI caller) and the forwarder
(``throughline.serve.forward``: a member passing a read on to a member that holds its partition).
Standard library only (``urllib``), never through a proxy.

``send`` makes one request and raises ``ServerUnavailableError`` (retriable) when the server cannot be
reached, times out, resets, or cuts its answer short; any HTTP answer is returned as it is.
``exchange`` sends one request along several URLs: a member that cannot be reached (or, when there is
another to try, a proxy's 502/504 page in front of it), or that answers HTTP 503, is passed over for the
next, each at most once, starting with ``start``; the first other answer wins. When no member answers
other than 503, the last 503 answer is returned; when none answers at all, the last
``ServerUnavailableError`` is raised.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from throughline.serve.exceptions import (
    ServerUnavailableError,
    TlsExpiredError,
    TlsHostnameError,
    TlsUntrustedError,
    TlsVerifyError,
)

# OpenSSL's X509_V_ERR_* codes of the certificate failures that get their own error code.
_X509_NOT_YET_VALID = 9
_X509_EXPIRED = 10
_X509_HOSTNAME_MISMATCH = 62
_X509_IP_ADDRESS_MISMATCH = 64

#: Larger answers are cut here (a read page is at most ~100 bodies of 64 KiB by default).
MAX_RESPONSE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    """What a member answered: its URL, the status, the headers (lower-case names) and the body."""

    url: str
    status: int
    headers: Mapping[str, str]
    body: bytes


def new_opener(context: ssl.SSLContext | None = None) -> urllib.request.OpenerDirector:
    """A ``urllib`` opener that never goes through a proxy (members are addressed directly);
    ``context``: how ``https://`` servers are verified (default: the system's trust store)."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    return urllib.request.build_opener(*handlers)


def tls_error(url: str, exc: ssl.SSLCertVerificationError) -> TlsVerifyError:
    """The typed error of a refused server certificate (expired, wrong host, untrusted)."""
    code = getattr(exc, "verify_code", None)
    detail = getattr(exc, "verify_message", None) or exc.__class__.__name__
    if code in (_X509_EXPIRED, _X509_NOT_YET_VALID):
        return TlsExpiredError(f"the certificate of {url} is refused: {detail}")
    if code in (_X509_HOSTNAME_MISMATCH, _X509_IP_ADDRESS_MISMATCH):
        return TlsHostnameError(f"the certificate of {url} does not name its host: {detail}")
    return TlsUntrustedError(f"the certificate of {url} is not signed by a trusted CA (--ca): {detail}")


def lower_headers(message: object) -> dict[str, str]:
    """Response headers with lower-case names (HTTP header names are case-insensitive)."""
    items = getattr(message, "items", None)
    return {str(k).lower(): str(v) for k, v in (items() if items is not None else [])}


def is_error_document(payload: bytes) -> bool:
    """Whether ``payload`` is a throughline error document (``{"error": {...}}``)."""
    try:
        document = json.loads(payload)
    except ValueError:
        return False
    return isinstance(document, dict) and isinstance(document.get("error"), dict)


def send(
    opener: urllib.request.OpenerDirector,
    url: str,
    method: str,
    target: str,
    data: bytes | None,
    headers: Mapping[str, str],
    timeout: float,
) -> tuple[int, dict[str, str], bytes]:
    """``method url+target``: (status, headers, body) of any HTTP answer; ``ServerUnavailableError``
    when no answer came whole within ``timeout`` seconds."""
    request = urllib.request.Request(url + target, data=data, method=method, headers=dict(headers))
    try:
        with opener.open(request, timeout=max(0.001, timeout)) as response:
            payload = response.read(MAX_RESPONSE_BYTES)
            declared = response.headers.get("Content-Length")
            if declared is not None and declared.isdigit() and len(payload) < int(declared):
                # read(amt) returns what arrived when the server dies mid-answer: a transient fault.
                raise ServerUnavailableError(f"throughline serve at {url} cut its answer short")
            return response.status, lower_headers(response.headers), payload
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, lower_headers(exc.headers), exc.read(MAX_RESPONSE_BYTES)
    except (OSError, http.client.HTTPException) as exc:  # URLError, refused, reset, timed out, cut short
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ssl.SSLCertVerificationError):
            raise tls_error(url, reason) from None
        raise ServerUnavailableError(f"cannot reach throughline serve at {url}: {reason}") from None


def exchange(
    opener: urllib.request.OpenerDirector,
    urls: Sequence[str],
    method: str,
    target: str,
    data: bytes | None,
    headers: Mapping[str, str],
    *,
    timeout: float,
    start: int = 0,
    deadline: float | None = None,
) -> tuple[int, HttpAnswer]:
    """The request along ``urls`` (see the module): (the index of the member that answered, its
    answer). Each attempt may take ``timeout`` seconds, and all of them together end by ``deadline``
    (a ``time.monotonic()`` instant) when one is given."""
    count = len(urls)
    if count == 0:
        raise ValueError("exchange needs at least one URL")
    last_answer: tuple[int, HttpAnswer] | None = None
    unreachable: ServerUnavailableError | None = None
    for step in range(count):
        index = (start + step) % count
        url = urls[index]
        budget = timeout if deadline is None else min(timeout, deadline - time.monotonic())
        if budget <= 0:
            unreachable = unreachable or ServerUnavailableError(f"no time left to reach throughline serve at {url}")
            break
        try:
            status, answer_headers, payload = send(opener, url, method, target, data, headers, budget)
        except ServerUnavailableError as exc:
            unreachable = exc
            continue
        if status in (502, 504) and count > 1 and not is_error_document(payload):
            unreachable = ServerUnavailableError(f"{url} answered HTTP {status}")  # a proxy before it
            continue
        answer = HttpAnswer(url=url, status=status, headers=answer_headers, body=payload)
        if status == 503 and step < count - 1:
            last_answer = (index, answer)
            continue
        return index, answer
    if last_answer is not None:
        return last_answer
    assert unreachable is not None
    raise unreachable
