"""Scoped read tokens: signed, self-contained bearer tokens that say which projects a caller may read.

The format (docs/security.md is the reference)::

    tl1.<kid>.<claims>.<signature>

- ``tl1``: the format version; it fixes the algorithm (Ed25519). There is no algorithm field to choose
  from, so a token cannot ask to be checked with another algorithm (no "none", no HMAC keyed with the
  public key);
- ``kid``: 16 lower-case hex digits, the first 8 bytes of the SHA-256 of the raw 32-byte public key;
- ``claims``: base64url (no padding) of a JSON object with exactly these members: ``aud`` (the
  audience: the deployment the token is for), ``scope`` (``read``, ``metrics`` or ``admin``),
  ``projects`` (exact project names), ``prefixes`` (project-name prefixes), ``iat`` and ``exp`` (Unix
  seconds), ``jti`` (a random token id, safe to log) and an optional ``label``;
- ``signature``: base64url of the Ed25519 signature of the ASCII text ``tl1.<kid>.<claims>``.

Every base64url segment must be the canonical encoding of its bytes, so that no two texts are the same
token (a flipped padding bit is a different, refused token). A token is at most 4,096 characters.

Ed25519 is asymmetric: ``serve`` holds only public keys, so a member (or anyone who reads its key
folder) can verify tokens but never issue one. The private key stays where ``token issue`` runs.

Key files (``token keygen``) are JSON: ``{"schema": "throughline.token_key.v1", "kid", "algorithm":
"Ed25519", "publicKey", "privateKey"}`` (base64url raw keys, mode 0600); a public key file has no
``privateKey``. ``KeyRing`` reads a key file or a folder of them and keeps only the public keys.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import threading
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from throughline.core.encoding import b64url_decode as b64decode
from throughline.core.encoding import b64url_encode as b64encode
from throughline.core.identity import canonical_project
from throughline.errors import ThroughlineError
from throughline.serve.exceptions import (
    ForbiddenError,
    ForbiddenProjectError,
    InvalidTokenKeyError,
    InvalidTokenRequestError,
    TokenAudienceError,
    TokenExpiredError,
    TokenMalformedError,
    TokenSignatureError,
    TokenUnknownKeyError,
)

if TYPE_CHECKING:  # cryptography loads when a key is used, not with every `throughline` command
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

VERSION = "tl1"
KEY_SCHEMA = "throughline.token_key.v1"
ALGORITHM = "Ed25519"
DEFAULT_AUDIENCE = "throughline"
MAX_TOKEN_CHARS = 4096
#: A key file is a few hundred bytes; anything much larger is not one.
MAX_KEY_FILE_BYTES = 16 * 1024
#: Keys a folder may hold (a rotation needs two or three).
MAX_KEYS = 64
MAX_LABEL_CHARS = 200
SCOPES = ("read", "metrics", "admin")
Scope = Literal["read", "metrics", "admin"]

_KID = re.compile(r"^[0-9a-f]{16}\Z")
_CLAIMS = frozenset({"aud", "scope", "projects", "prefixes", "iat", "exp", "jti", "label"})
_REQUIRED = _CLAIMS - {"label"}


def key_id(public: Ed25519PublicKey) -> str:
    """The key id of a public key: the first 8 bytes of the SHA-256 of its raw form, in hex."""
    return hashlib.sha256(_raw_public(public)).hexdigest()[:16]


def _raw_public(public: Ed25519PublicKey) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return public.public_bytes(Encoding.Raw, PublicFormat.Raw)


# -- key files


@dataclass(frozen=True, slots=True)
class SigningKey:
    """A private key read from a ``token keygen`` file, with its key id."""

    kid: str
    private: Ed25519PrivateKey


def generate_key_file(path: str | os.PathLike[str], *, public_out: str | os.PathLike[str] | None = None) -> str:
    """Write a new signing key to ``path`` (mode 0600, never over an existing file); return its key id.

    ``public_out``: also write the public half alone (what ``serve --token-keys`` needs)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    private = Ed25519PrivateKey.generate()

    raw_private = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    public = private.public_key()
    kid = key_id(public)
    document = {
        "schema": KEY_SCHEMA,
        "kid": kid,
        "algorithm": ALGORITHM,
        "publicKey": b64encode(_raw_public(public)),
    }
    _write_new(Path(path), dict(document, privateKey=b64encode(raw_private)), private=True)
    if public_out is not None:
        _write_new(Path(public_out), document, private=False)
    return kid


def _write_new(path: Path, document: dict[str, str], *, private: bool) -> None:
    text = json.dumps(document, indent=2, sort_keys=True) + "\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    except FileExistsError:
        raise InvalidTokenKeyError(f"{path} exists already; a key file is never overwritten") from None
    except OSError as exc:
        raise InvalidTokenKeyError(f"cannot create the key file {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def _read_key_document(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise InvalidTokenKeyError(f"cannot read the token key file {path}: {exc.strerror or exc}") from None
    try:
        document = json.loads(raw) if len(raw) <= MAX_KEY_FILE_BYTES else None
    except ValueError:
        document = None
    if not isinstance(document, dict) or document.get("schema") != KEY_SCHEMA or document.get("algorithm") != ALGORITHM:
        raise InvalidTokenKeyError(f"{path} is not a throughline token key file ({KEY_SCHEMA}, {ALGORITHM})")
    return document


def _public_of(path: Path, document: dict[str, Any]) -> tuple[str, Ed25519PublicKey]:
    raw = b64decode(str(document.get("publicKey", "")))
    if raw is None or len(raw) != 32:
        raise InvalidTokenKeyError(f"{path}: publicKey is not a base64url Ed25519 public key")
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    public = Ed25519PublicKey.from_public_bytes(raw)
    kid = key_id(public)
    if document.get("kid") != kid:
        raise InvalidTokenKeyError(f"{path}: the kid does not belong to its public key")
    return kid, public


def load_signing_key(path: str | os.PathLike[str]) -> SigningKey:
    """The private key of a ``token keygen`` file (``InvalidTokenKeyError`` for a public-only file)."""
    p = Path(path)
    document = _read_key_document(p)
    kid, public = _public_of(p, document)
    raw = b64decode(str(document.get("privateKey", "")))
    if raw is None or len(raw) != 32:
        raise InvalidTokenKeyError(f"{p} holds no private key (a public key file verifies, it cannot issue)")
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Ed25519PrivateKey.from_private_bytes(raw)
    if _raw_public(private.public_key()) != _raw_public(public):
        raise InvalidTokenKeyError(f"{p}: the private key does not match its public key")
    return SigningKey(kid=kid, private=private)


def load_verification_keys(path: str | os.PathLike[str]) -> dict[str, Ed25519PublicKey]:
    """The public keys of a key file, or of every file in a folder (hidden files and ``*~`` left out).

    Only the public halves are kept: a key file with a private key verifies, and its private key is
    dropped at once."""
    p = Path(path)
    if p.is_dir():
        files = sorted(
            f for f in p.iterdir() if f.is_file() and not f.name.startswith(".") and not f.name.endswith("~")
        )
    elif p.is_file():
        files = [p]
    else:
        raise InvalidTokenKeyError(f"--token-keys {p}: no such file or folder")
    if len(files) > MAX_KEYS:
        raise InvalidTokenKeyError(f"--token-keys {p}: more than {MAX_KEYS} key files")
    keys: dict[str, Ed25519PublicKey] = {}
    for f in files:
        kid, public = _public_of(f, _read_key_document(f))
        keys[kid] = public
    if not keys:
        raise InvalidTokenKeyError(f"--token-keys {p}: the folder holds no key file")
    return keys


def _stamp(path: Path) -> tuple[tuple[str, int, int], ...]:
    """What changes when a key file is added, removed or rewritten (names, sizes, mtimes)."""
    try:
        entries = [path] if not path.is_dir() else sorted(path.iterdir())
        return tuple((e.name, s.st_size, s.st_mtime_ns) for e in entries for s in [e.stat()])
    except OSError:
        return ()


class KeyRing:
    """The verification keys of ``serve --token-keys PATH``, by key id; ``reload`` re-reads PATH.

    A reload that fails (a half-written file, a folder emptied by mistake) keeps the keys in use and
    raises, so a bad edit never locks every caller out; ``reload_if_changed`` is cheap to call often.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp = _stamp(self.path)
        self._keys = load_verification_keys(self.path)
        self.generation = 1

    def get(self, kid: str) -> Ed25519PublicKey | None:
        """The public key of ``kid``, or ``None`` (unknown or retired)."""
        with self._lock:
            return self._keys.get(kid)

    def kids(self) -> tuple[str, ...]:
        """The key ids this ring verifies, sorted."""
        with self._lock:
            return tuple(sorted(self._keys))

    def reload(self) -> tuple[str, ...]:
        """Re-read the path; return the key ids now held (``InvalidTokenKeyError``: the old keys stay)."""
        stamp = _stamp(self.path)
        keys = load_verification_keys(self.path)
        with self._lock:
            self._keys = keys
            self._stamp = stamp
            self.generation += 1
        return self.kids()

    def reload_if_changed(self) -> bool:
        """Reload when a file was added, removed or rewritten since the last load; True if it reloaded."""
        if _stamp(self.path) == self._stamp:
            return False
        self.reload()
        return True


# -- issuing


def parse_duration(text: str) -> int:
    """``90s``, ``15m``, ``12h``, ``30d``, ``2w`` or plain seconds, as seconds (1 s .. 10 years)."""
    m = re.fullmatch(r"\s*(\d{1,9})\s*([smhdw]?)\s*", text)
    if m is None:
        raise InvalidTokenRequestError(f"--expires must be a duration such as 3600s, 90m, 12h or 30d, got {text!r}")
    seconds = int(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]
    if not 1 <= seconds <= 10 * 365 * 86400:
        raise InvalidTokenRequestError("--expires must be between 1 second and 10 years")
    return seconds


def _check_names(values: Iterable[str], what: str) -> list[str]:
    names = []
    for value in values:
        if not isinstance(value, str) or not value or len(value.encode("utf-8")) > 1024 or "\x00" in value:
            raise InvalidTokenRequestError(f"every {what} must be non-empty text of at most 1 KiB without NUL")
        if value not in names:
            names.append(value)
    return names


def issue_token(
    key: SigningKey,
    *,
    projects: Iterable[str] = (),
    prefixes: Iterable[str] = (),
    scope: str = "read",
    expires_in: int,
    audience: str = DEFAULT_AUDIENCE,
    label: str | None = None,
    now: float | None = None,
) -> str:
    """A signed token for ``scope`` over ``projects`` and ``prefixes`` (a read token needs one)."""
    if scope not in SCOPES:
        raise InvalidTokenRequestError(f"--scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    names, starts = _check_names(projects, "--project"), _check_names(prefixes, "--project-prefix")
    try:  # the form reads are judged in (a prefix is compared as given, in NFC, so its trailing / stays)
        names = [canonical_project(n) for n in names]
    except ThroughlineError as exc:
        raise InvalidTokenRequestError(f"--project: {exc.message}") from None
    starts = [unicodedata.normalize("NFC", p) for p in starts]
    if scope == "read" and not names and not starts:
        raise InvalidTokenRequestError("a read token needs --project P or --project-prefix PREFIX (at least one)")
    if not audience or len(audience) > 200:
        raise InvalidTokenRequestError("--audience must be 1..200 characters")
    if label is not None and (len(label) > MAX_LABEL_CHARS or not label.isprintable()):
        raise InvalidTokenRequestError(f"--label must be printable text of at most {MAX_LABEL_CHARS} characters")
    issued = int(time.time() if now is None else now)
    claims: dict[str, Any] = {
        "aud": audience,
        "scope": scope,
        "projects": names,
        "prefixes": starts,
        "iat": issued,
        "exp": issued + expires_in,
        "jti": secrets.token_hex(8),
    }
    if label is not None:
        claims["label"] = label
    body = b64encode(json.dumps(claims, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode("utf-8"))
    signed = f"{VERSION}.{key.kid}.{body}"
    token = f"{signed}.{b64encode(key.private.sign(signed.encode('ascii')))}"
    if len(token) > MAX_TOKEN_CHARS:
        raise InvalidTokenRequestError(
            f"the token would be {len(token)} characters, over the {MAX_TOKEN_CHARS} a header carries: "
            "use --project-prefix instead of many --project"
        )
    return token


# -- verifying


@dataclass(frozen=True, slots=True)
class Grant:
    """What a request may do: the verified token's scope and projects (or the admin token's all)."""

    scope: Scope
    projects: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()
    expires: int | None = None
    kid: str | None = None
    jti: str | None = None

    def covers(self, project: object) -> bool:
        """Whether a read of ``project`` is allowed (an admin reads every project).

        Compared in the canonical form the reader hashes (``canonical_project``), so that a name such
        as ``/srv/team-a/../team-b/x`` is judged as the project it reads, ``/srv/team-b/x``; a name
        that has no canonical form is covered by no read token."""
        if self.scope == "admin":
            return True
        if self.scope != "read" or not isinstance(project, str):
            return False
        try:
            name = canonical_project(project)
        except ThroughlineError:
            return False
        return name in self.projects or any(name.startswith(p) for p in self.prefixes)

    def require_project(self, project: object) -> None:
        """``ForbiddenProjectError`` unless ``covers(project)``; the error names no project."""
        if not self.covers(project):
            if self.scope == "metrics":
                raise ForbiddenError("a metrics token does not read projects")
            raise ForbiddenProjectError("this token does not allow reading this project")

    def require_metrics(self) -> None:
        """``ForbiddenError`` unless the scope is ``metrics`` or ``admin``."""
        if self.scope not in ("metrics", "admin"):
            raise ForbiddenError("this token does not allow reading the metrics (scope metrics or admin does)")


ADMIN = Grant(scope="admin")


def _canonical_names(names: Iterable[str]) -> list[str]:
    """The canonical forms of the names that have one (the others cover nothing)."""
    found = []
    for name in names:
        try:
            found.append(canonical_project(name))
        except ThroughlineError:
            continue
    return found


def _claims(segment: str) -> dict[str, Any]:
    raw = b64decode(segment)
    try:
        claims = json.loads(raw.decode("utf-8")) if raw is not None else None
    except (UnicodeDecodeError, ValueError):
        claims = None
    if not isinstance(claims, dict) or not _REQUIRED <= set(claims) <= _CLAIMS:
        raise TokenMalformedError("the token's claims are not the token schema")
    ok = (
        isinstance(claims["aud"], str)
        and claims["scope"] in SCOPES
        and isinstance(claims["projects"], list)
        and all(isinstance(p, str) and p for p in claims["projects"])
        and isinstance(claims["prefixes"], list)
        and all(isinstance(p, str) and p for p in claims["prefixes"])
        and all(type(claims[k]) is int for k in ("iat", "exp"))
        and isinstance(claims["jti"], str)
        and isinstance(claims.get("label", ""), str)
    )
    if not ok:
        raise TokenMalformedError("the token's claims are not the token schema")
    return claims


def verify_token(token: str, ring: KeyRing, *, audience: str = DEFAULT_AUDIENCE, now: float | None = None) -> Grant:
    """The ``Grant`` of a scoped token, or the 401 error that says why it is refused.

    Checked in this order: size and shape, key id, signature, claims schema, audience, expiry; nothing
    of the claims is trusted before the signature verified."""
    if len(token) > MAX_TOKEN_CHARS or not token.isascii():
        raise TokenMalformedError(f"the token is not a {VERSION} token of at most {MAX_TOKEN_CHARS} characters")
    parts = token.split(".")
    if len(parts) != 4 or parts[0] != VERSION or not _KID.match(parts[1]):
        raise TokenMalformedError(f"the token is not a {VERSION} token (tl1.<kid>.<claims>.<signature>)")
    signature = b64decode(parts[3])
    if signature is None or len(signature) != 64 or b64decode(parts[2]) is None:
        raise TokenMalformedError("the token's claims or signature are not canonical base64url")
    from cryptography.exceptions import InvalidSignature

    public = ring.get(parts[1])
    if public is None:
        raise TokenUnknownKeyError("the token is signed by a key this server does not accept (unknown or retired)")
    try:
        public.verify(signature, f"{parts[0]}.{parts[1]}.{parts[2]}".encode("ascii"))
    except InvalidSignature:
        raise TokenSignatureError("the token's signature does not verify") from None
    claims = _claims(parts[2])
    if claims["aud"] != audience:
        raise TokenAudienceError("the token was issued for another audience")
    if claims["exp"] <= (time.time() if now is None else now):
        raise TokenExpiredError("the token has expired")
    return Grant(
        scope=claims["scope"],
        projects=frozenset(_canonical_names(claims["projects"])),
        prefixes=tuple(unicodedata.normalize("NFC", p) for p in claims["prefixes"]),
        expires=claims["exp"],
        kid=parts[1],
        jti=claims["jti"],
    )


class VerifiedTokens:
    """A bounded memo of verified tokens (a signature check costs ~100 us; an Observer sends the same
    token with every page). Expiry is checked on every use; a key reload empties the memo."""

    def __init__(self, ring: KeyRing, audience: str, size: int = 1024) -> None:
        self.ring = ring
        self.audience = audience
        self._size = size
        self._lock = threading.Lock()
        self._grants: OrderedDict[str, Grant] = OrderedDict()
        self._generation = ring.generation

    def grant(self, token: str) -> Grant:
        """The token's grant (``verify_token``'s errors when refused)."""
        now = time.time()
        with self._lock:
            if self._generation != self.ring.generation:
                self._grants.clear()
                self._generation = self.ring.generation
            grant = self._grants.get(token)
            if grant is not None:
                self._grants.move_to_end(token)
        if grant is None:
            grant = verify_token(token, self.ring, audience=self.audience, now=now)
            with self._lock:
                self._grants[token] = grant
                while len(self._grants) > self._size:
                    self._grants.popitem(last=False)
        elif grant.expires is not None and grant.expires <= now:
            raise TokenExpiredError("the token has expired")
        return grant
