"""A member of a ``serve --group`` passing a read on to a member that holds the read's partition.

Any member answers any read (docs/scale-out.md): from its own projection when it holds the partition
and has applied what the read needs, else by forwarding the request to a holder and returning that
answer unchanged. ``forward_read`` is that second path, and only that:

- **one hop**: the forwarded request carries ``Throughline-Forwarded-By: <the forwarding member's
  URL>``; a request that carries it is never forwarded again (``AlreadyForwardedError``; the member that
  received it answers it itself). Two members whose views of the group disagree for a moment (a
  rebalance in flight) therefore cannot pass a read back and forth;
- **the original authentication**: the caller's ``Authorization`` header goes on verbatim, so the
  member that answers checks the caller's token and its scope itself, never the forwarder's (every
  member of a group shares the admin token, the token verification keys and the page-token key, so
  the holder checks the same token and issues the same page tokens), with the request's
  ``Content-Type`` and ``Accept``; nothing else of the incoming request is passed on;
- **the answer unchanged**: status, body byte for byte, and the headers that carry meaning
  (``Content-Type``, ``Cache-Control``, ``Throughline-Reason``, ``Retry-After``, ``WWW-Authenticate``);
- **bounded**: each holder gets ``timeout`` seconds at most, all of them together end by ``deadline``
  when one is given; a holder that cannot be reached, or answers 503, is passed over for the next
  (``transport.exchange``), and when none can be reached the read fails with ``ForwardFailedError``
  (retriable: the HTTP API answers it 503, so a client fails over in turn).

The caller (``group.GroupRouter.route``) decides when to forward and to whom (``OwnerMap.urls(partition)``);
it passes ``timeout`` covering the holder's own bounded wait plus any long-poll ``wait`` of the request.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from throughline.serve import READ_PATH
from throughline.serve.exceptions import AlreadyForwardedError, ForwardFailedError, ServerUnavailableError
from throughline.serve.transport import exchange, new_opener

#: Marks a forwarded request; its value is the forwarding member's advertised URL.
FORWARDED_HEADER = "Throughline-Forwarded-By"
#: Request headers a forwarded read keeps (lower-case).
PASSED_REQUEST_HEADERS = ("authorization", "content-type", "accept")
#: Answer headers the forwarding member hands back with the holder's answer (lower-case).
KEPT_ANSWER_HEADERS = ("content-type", "cache-control", "throughline-reason", "retry-after", "www-authenticate")
_METHODS = ("GET", "POST")


@dataclass(frozen=True, slots=True)
class ForwardedRead:
    """A holder's answer to a forwarded read: which member answered, and what it answered."""

    url: str
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


def is_forwarded(headers: Mapping[str, str]) -> bool:
    """Whether a request with these headers was forwarded by another member (so it must not be again)."""
    marker = FORWARDED_HEADER.lower()
    return any(str(name).lower() == marker for name in headers.keys())


def forward_read(
    holders: Sequence[str],
    *,
    method: str,
    target: str,
    body: bytes | None,
    headers: Mapping[str, str],
    via: str,
    timeout: float,
    deadline: float | None = None,
    context: ssl.SSLContext | None = None,
) -> ForwardedRead:
    """Pass one read (``method`` ``target``: the read path with its query string; ``body`` for POST;
    ``headers``: the incoming request's) on to the first of ``holders`` that answers, and return that
    answer unchanged. ``via``: this member's advertised URL (never forwarded to itself); ``context``: how
    ``https://`` members are verified (and the certificate this member presents to them)."""
    if method.upper() not in _METHODS:
        raise ValueError(f"only reads are forwarded, not {method!r}")
    if not (target == READ_PATH or target.startswith(READ_PATH + "?")):
        raise ValueError(f"only reads are forwarded, not {target!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    if is_forwarded(headers):
        raise AlreadyForwardedError(
            "this read was forwarded here by another member and is not forwarded again (one hop)"
        )
    urls = [url.rstrip("/") for url in holders if url.rstrip("/") != via.rstrip("/")]
    if not urls:
        raise ForwardFailedError("no other member holds this read's partition now")
    passed = {str(k).lower(): str(v) for k, v in headers.items() if str(k).lower() in PASSED_REQUEST_HEADERS}
    passed[FORWARDED_HEADER] = via
    passed["user-agent"] = "throughline-forward"
    if deadline is None:
        deadline = time.monotonic() + timeout * len(urls)
    try:
        _, answer = exchange(
            new_opener(context),
            urls,
            method.upper(),
            target,
            body if method.upper() == "POST" else None,
            passed,
            timeout=timeout,
            deadline=deadline,
        )
    except ServerUnavailableError as exc:
        raise ForwardFailedError(f"no member holding this read's partition answered: {exc.message}") from None
    kept = tuple((name, answer.headers[name]) for name in KEPT_ANSWER_HEADERS if name in answer.headers)
    return ForwardedRead(url=answer.url, status=answer.status, headers=kept, body=answer.body)
