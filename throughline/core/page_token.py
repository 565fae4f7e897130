"""Page tokens (schema ``throughline.observer_page.v1``): opaque, MAC'd, bound to one read series.

Format::

    "tlp1." + base64url(payload) + "." + base64url(HMAC-SHA-256(key, DOMAIN || payload))

``payload`` is canonical JSON (sorted keys, no spaces) of exactly::

    {"afterSha256": hex, "offset": int, "projectSha256": hex, "schema": "throughline.observer_page.v1",
     "throughSha256": hex}

- ``projectSha256``: SHA-256 of the canonical project; ``afterSha256`` / ``throughSha256``: SHA-256 of
  the exact cursor strings the series uses (a null after cursor hashes ``NULL_AFTER``).
- ``offset``: where the next page starts within the series' range, a safe integer >= 0.

A token embeds no path, text, raw id or cursor text. It is never usable alone: ``open_page_token``
re-hashes the project, after and through the caller sent and requires an exact match. Every refusal is a
``PageTokenError`` (a hard input error) with a stable ``code``:

========================  ==========================================================
``page_token_oversize``   longer than 4 KiB
``page_token_version``    a token of another schema version
``page_token_malformed``  not a token of this shape at all
``page_token_tampered``   the MAC does not verify (any changed byte, or another key)
``page_token_mismatch``   bound to another project, after cursor or through cursor
``page_token_offset``     an offset past the end of the series' range
========================  ==========================================================
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass

from throughline.core.encoding import b64url_decode, b64url_encode
from throughline.core.exceptions import (
    PageTokenMalformedError,
    PageTokenMismatchError,
    PageTokenOffsetError,
    PageTokenOversizeError,
    PageTokenTamperedError,
    PageTokenVersionError,
)

SCHEMA = "throughline.observer_page.v1"
MAX_TOKEN_BYTES = 4096
MAX_SAFE_INTEGER = 2**53 - 1
NULL_AFTER = b"throughline.observer_page.v1:null-after-cursor"
_DOMAIN = b"throughline.observer_page.v1\x00"
_PREFIX = "tlp1."
# ``\Z``, not ``$``: a token with a trailing newline is not the token that was issued.
_SHAPE = re.compile(r"^tlp([0-9]{1,4})\.([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]+)\Z")
_HEX64 = re.compile(r"[0-9a-f]{64}")


_FIELDS = frozenset({"schema", "projectSha256", "afterSha256", "throughSha256", "offset"})


def _payload_offset(raw: object) -> tuple[str, str, str, int] | None:
    """The payload's (project, after, through, offset) when it has exactly the schema's shape, else ``None``.

    Exact: these five keys and no other, lowercase 64-digit hex strings, an ``int`` offset (never a
    bool or a float) from 0 to 2**53 - 1.
    """
    if not isinstance(raw, dict) or raw.keys() != _FIELDS or raw["schema"] != SCHEMA:
        return None
    hashes = (raw["projectSha256"], raw["afterSha256"], raw["throughSha256"])
    if not all(isinstance(h, str) and _HEX64.fullmatch(h) for h in hashes):
        return None
    offset = raw["offset"]
    if type(offset) is not int or not 0 <= offset <= MAX_SAFE_INTEGER:
        return None
    return (*hashes, offset)


@dataclass(frozen=True, slots=True)
class SeriesBinding:
    """What a page token is bound to: one project, one exact after cursor, one exact through cursor."""

    project_sha256: bytes
    after_sha256: bytes
    through_sha256: bytes

    @classmethod
    def of(cls, project_sha256: bytes, after_cursor: str | None, through_cursor: str) -> SeriesBinding:
        """Hash the exact strings a caller sent."""
        after = NULL_AFTER if after_cursor is None else after_cursor.encode("utf-8")
        return cls(
            project_sha256,
            hashlib.sha256(after).digest(),
            hashlib.sha256(through_cursor.encode("utf-8")).digest(),  # mutant-anchor: token-unbound
        )


def _mac(key: bytes, payload: bytes) -> bytes:
    return hmac.new(key, _DOMAIN + payload, hashlib.sha256).digest()


def issue_page_token(key: bytes, binding: SeriesBinding, offset: int) -> str:
    """Issue the token of the page that starts at ``offset`` of the series ``binding`` names."""
    if isinstance(offset, bool) or not 0 <= offset <= MAX_SAFE_INTEGER:
        raise ValueError("offset must be a safe integer >= 0")
    payload = json.dumps(
        {
            "afterSha256": binding.after_sha256.hex(),
            "offset": offset,
            "projectSha256": binding.project_sha256.hex(),
            "schema": SCHEMA,
            "throughSha256": binding.through_sha256.hex(),
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode("ascii")
    return _PREFIX + b64url_encode(payload) + "." + b64url_encode(_mac(key, payload))


def open_page_token(key: bytes, token: object, binding: SeriesBinding) -> int:
    """Verify ``token`` against ``binding`` and return its offset; raise ``PageTokenError`` otherwise.

    The offset is not checked against the series' range here (the range is known only after the
    cursors are resolved); ``check_offset_in_range`` does that.
    """
    if not isinstance(token, str):
        raise PageTokenMalformedError("page token must be a string")
    if len(token.encode("utf-8", "surrogatepass")) > MAX_TOKEN_BYTES:
        raise PageTokenOversizeError(f"page token is larger than {MAX_TOKEN_BYTES} bytes")
    m = _SHAPE.match(token)
    if not m:
        raise PageTokenMalformedError("page token is malformed")
    if m.group(1) != "1":
        raise PageTokenVersionError(f"page token version {m.group(1)} is not {SCHEMA}")
    payload = b64url_decode(m.group(2))
    tag = b64url_decode(m.group(3))
    if payload is None or tag is None or len(tag) != 32:
        raise PageTokenMalformedError("page token is malformed")
    if not hmac.compare_digest(tag, _mac(key, payload)):
        raise PageTokenTamperedError("page token failed verification")
    try:
        raw = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        raise PageTokenMalformedError("page token payload is malformed") from None
    if isinstance(raw, dict) and raw.get("schema") != SCHEMA and "schema" in raw:
        raise PageTokenVersionError("page token is of another schema version")
    parsed = _payload_offset(raw)
    if parsed is None:
        raise PageTokenMalformedError("page token does not match its schema")
    project_hex, after, through, offset = parsed
    if (
        project_hex != binding.project_sha256.hex()
        or after != binding.after_sha256.hex()
        or through != binding.through_sha256.hex()
    ):
        raise PageTokenMismatchError("page token belongs to another project, after cursor or through cursor")
    return offset


def check_offset_in_range(offset: int, range_size: int) -> None:
    """A token's offset must name a page inside the series' range."""
    if offset >= range_size:
        raise PageTokenOffsetError(
            f"page token offset {offset} is past the end of the series ({range_size} turns)",
        )
