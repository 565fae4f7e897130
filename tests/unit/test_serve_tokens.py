"""Scoped read tokens (``throughline.serve.tokens``, docs/security.md): the format, the key files, the
CLI, and a fuzz of everything a token can be turned into (each refused with its typed 401 error)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from throughline.serve.auth import BearerAuth
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
    UnauthorizedError,
)
from throughline.serve.tokens import (
    ADMIN,
    MAX_TOKEN_CHARS,
    KeyRing,
    VerifiedTokens,
    b64decode,
    b64encode,
    generate_key_file,
    issue_token,
    load_signing_key,
    parse_duration,
    verify_token,
)

NOW = 1_800_000_000


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path, KeyRing]:
    """A signing key, its public file alone in a folder, and the ring over that folder."""
    folder = tmp_path / "verify"
    folder.mkdir()
    generate_key_file(tmp_path / "signing.json", public_out=folder / "k1.pub")
    return tmp_path / "signing.json", folder, KeyRing(folder)


def _token(signing: Path, **kwargs: object) -> str:
    args: dict[str, object] = {"projects": ["/srv/team-a/app"], "expires_in": 3600, "now": NOW}
    args.update(kwargs)
    return issue_token(load_signing_key(signing), **args)  # type: ignore[arg-type]


def test_a_token_round_trips_with_its_scope(keys: tuple[Path, Path, KeyRing]) -> None:
    signing, _, ring = keys
    token = _token(signing, prefixes=["/srv/team-b/"], label="observer of team a")
    grant = verify_token(token, ring, now=NOW + 10)
    assert grant.scope == "read" and grant.kid == load_signing_key(signing).kid
    assert grant.covers("/srv/team-a/app") and grant.covers("/srv/team-b/x")
    assert not grant.covers("/srv/team-a/app2") and not grant.covers("/srv/team-c/x") and not grant.covers(None)
    with pytest.raises(ForbiddenProjectError) as refused:
        grant.require_project("/srv/secret/project")
    assert "/srv" not in refused.value.message
    with pytest.raises(ForbiddenError):
        grant.require_metrics()
    assert token.count(".") == 3 and token.startswith("tl1.") and len(token) < 600


def test_scope_is_judged_on_the_canonical_project(keys: tuple[Path, Path, KeyRing]) -> None:
    signing, _, ring = keys
    grant = verify_token(_token(signing, projects=["/srv/x/../team-c/app/"], prefixes=["/srv/team-a/"]), ring, now=NOW)
    assert grant.covers("/srv/team-a/app") and grant.covers("/srv/team-a//app/./sub")
    assert grant.covers("/srv/team-c/app") and grant.covers("/srv//team-c/app/")  # the same project
    for escape in (
        "/srv/team-a/../team-b/x",
        "/srv/team-a/..",
        "/srv/team-a/app/../../team-b",
        "",
        ".",
        "a\x00",
    ):
        assert not grant.covers(escape), escape


def test_scopes_metrics_and_admin(keys: tuple[Path, Path, KeyRing]) -> None:
    signing, _, ring = keys
    metrics = verify_token(_token(signing, scope="metrics", projects=[]), ring, now=NOW)
    metrics.require_metrics()
    with pytest.raises(ForbiddenError) as refused:
        metrics.require_project("/srv/team-a/app")
    assert refused.value.code == "forbidden_scope"
    admin = verify_token(_token(signing, scope="admin", projects=[]), ring, now=NOW)
    admin.require_metrics()
    admin.require_project("/anything/at/all")


def test_key_files_are_private_and_the_public_file_cannot_issue(keys: tuple[Path, Path, KeyRing]) -> None:
    signing, folder, _ = keys
    assert stat.S_IMODE(os.stat(signing).st_mode) == 0o600
    document = json.loads(signing.read_text())
    assert set(document) == {"schema", "kid", "algorithm", "publicKey", "privateKey"}
    with pytest.raises(InvalidTokenKeyError):
        load_signing_key(folder / "k1.pub")
    with pytest.raises(InvalidTokenKeyError):
        generate_key_file(signing)  # never overwritten
    ring_of_private = KeyRing(signing)  # serve may be given the keygen file: it keeps the public half
    assert ring_of_private.kids() == (document["kid"],)


def test_a_kid_that_is_not_its_keys_is_refused(tmp_path: Path) -> None:
    generate_key_file(tmp_path / "a.json")
    document = json.loads((tmp_path / "a.json").read_text())
    document["kid"] = "0" * 16
    (tmp_path / "b.json").write_text(json.dumps(document))
    with pytest.raises(InvalidTokenKeyError):
        KeyRing(tmp_path / "b.json")


def test_issue_refuses_what_it_cannot_make(keys: tuple[Path, Path, KeyRing]) -> None:
    signing, _, _ = keys
    with pytest.raises(InvalidTokenRequestError):
        _token(signing, projects=[])  # a read token needs a project
    with pytest.raises(InvalidTokenRequestError):
        _token(signing, prefixes=[""])
    with pytest.raises(InvalidTokenRequestError):
        _token(signing, projects=[f"/p/{i:04d}" + "x" * 60 for i in range(60)])  # over 4 KiB
    for text in ("", "3x", "0", "-5", "99999999999d"):
        with pytest.raises(InvalidTokenRequestError):
            parse_duration(text)
    assert [parse_duration(t) for t in ("90", "90s", "15m", "12h", "30d", "2w")] == [
        90,
        90,
        900,
        43200,
        2592000,
        1209600,
    ]


def test_expired_wrong_audience_unknown_and_retired_keys(tmp_path: Path, keys: tuple[Path, Path, KeyRing]) -> None:
    signing, folder, ring = keys
    token = _token(signing)
    with pytest.raises(TokenExpiredError):
        verify_token(token, ring, now=NOW + 3600)
    with pytest.raises(TokenAudienceError):
        verify_token(_token(signing, audience="other-deployment"), ring, now=NOW)
    generate_key_file(tmp_path / "other.json")
    with pytest.raises(TokenUnknownKeyError):
        verify_token(_token(tmp_path / "other.json"), ring, now=NOW)
    # Another key under this key's id: the signature is the check.
    other = load_signing_key(tmp_path / "other.json")
    mine = load_signing_key(signing)
    forged = issue_token(type(mine)(kid=mine.kid, private=other.private), projects=["/x"], expires_in=60, now=NOW)
    with pytest.raises(TokenSignatureError):
        verify_token(forged, ring, now=NOW)
    # Retire the key: its tokens are refused after the reload, not before.
    verify_token(token, ring, now=NOW)
    generate_key_file(tmp_path / "k2.json", public_out=folder / "k2.pub")
    (folder / "k1.pub").unlink()
    assert ring.reload_if_changed()
    with pytest.raises(TokenUnknownKeyError):
        verify_token(token, ring, now=NOW)
    verify_token(_token(tmp_path / "k2.json"), ring, now=NOW)


def test_a_failed_reload_keeps_the_keys(keys: tuple[Path, Path, KeyRing]) -> None:
    signing, folder, ring = keys
    (folder / "broken.pub").write_text("{half a file")
    with pytest.raises(InvalidTokenKeyError):
        ring.reload()
    verify_token(_token(signing), ring, now=NOW)


def test_the_memo_forgets_retired_keys_and_expiry(tmp_path: Path, keys: tuple[Path, Path, KeyRing]) -> None:
    signing, folder, ring = keys
    memo = VerifiedTokens(ring, "throughline")
    import time as _time

    token = issue_token(load_signing_key(signing), projects=["/x"], expires_in=3600)
    assert memo.grant(token).covers("/x")
    assert memo.grant(token).covers("/x")  # from the memo
    generate_key_file(tmp_path / "k2.json", public_out=folder / "k2.pub")
    (folder / "k1.pub").unlink()
    ring.reload()
    with pytest.raises(TokenUnknownKeyError):
        memo.grant(token)
    issued = int(_time.time())
    short = issue_token(load_signing_key(tmp_path / "k2.json"), projects=["/x"], expires_in=2, now=issued)
    memo.grant(short)
    _time.sleep(max(0.0, issued + 2.05 - _time.time()))
    with pytest.raises(TokenExpiredError):
        memo.grant(short)


# -- the fuzz: every variation of a valid token is refused with a 401 error of its own code


def _refusal(token: str, ring: KeyRing) -> str:
    auth = BearerAuth("admin-token-0123456789abcdef", VerifiedTokens(ring, "throughline"))
    try:
        grant = auth.check(f"Bearer {token}")
    except UnauthorizedError as exc:
        return exc.code
    raise AssertionError(f"accepted: {grant}")


def test_every_single_bit_flip_is_refused(keys: tuple[Path, Path, KeyRing]) -> None:
    signing, _, ring = keys
    token = issue_token(load_signing_key(signing), projects=["/srv/team-a/app"], expires_in=3600)
    raw = token.encode("ascii")
    codes = set()
    for i in range(len(raw)):
        for bit in range(8):
            flipped = bytearray(raw)
            flipped[i] ^= 1 << bit
            text = flipped.decode("latin-1")
            codes.add(_refusal(text, ring))
    assert codes <= {"unauthorized", "token_malformed", "token_bad_signature", "token_unknown_key"}
    assert {"token_malformed", "token_bad_signature", "token_unknown_key"} <= codes


def test_truncations_and_extensions_are_refused(keys: tuple[Path, Path, KeyRing]) -> None:
    signing, _, ring = keys
    token = issue_token(load_signing_key(signing), projects=["/srv/team-a/app"], expires_in=3600)
    for n in range(1, len(token)):
        assert _refusal(token[:n], ring) != "", n
    for extra in ("A", ".", ".x", "=", "==", "AA"):
        _refusal(token + extra, ring)
    assert _refusal("tl1." + "A" * MAX_TOKEN_CHARS, ring) in {"token_malformed", "unauthorized"}
    assert _refusal(token[: len(token) - 1] + "A" * (MAX_TOKEN_CHARS - len(token) + 5), ring) == "token_malformed"


def test_algorithm_confusion_is_refused(keys: tuple[Path, Path, KeyRing]) -> None:
    signing, folder, ring = keys
    token = issue_token(load_signing_key(signing), projects=["/srv/team-a/app"], expires_in=3600)
    version, kid, claims, _ = token.split(".")
    public = base64.urlsafe_b64decode(json.loads((folder / "k1.pub").read_text())["publicKey"] + "==")
    signed = f"{version}.{kid}.{claims}".encode("ascii")
    hs256 = b64encode(hmac.new(public, signed, hashlib.sha256).digest())
    assert _refusal(f"{version}.{kid}.{claims}.{hs256}", ring) == "token_malformed"  # 32 bytes, not 64
    hs512 = b64encode(hmac.new(public, signed, hashlib.sha512).digest())
    assert _refusal(f"{version}.{kid}.{claims}.{hs512}", ring) == "token_bad_signature"
    assert _refusal(f"{version}.{kid}.{claims}.", ring) == "token_malformed"  # alg none: no signature
    jwt_none = (
        ".".join(b64encode(json.dumps(part).encode()) for part in ({"alg": "none", "typ": "JWT"}, {"scope": "admin"}))
        + "."
    )
    assert _refusal(jwt_none, ring) == "unauthorized"
    for prefix in ("tl0", "tl2", "TL1"):
        assert _refusal(f"{prefix}.{kid}.{claims}.{token.split('.')[3]}", ring) == "unauthorized"


def test_claims_must_be_the_exact_schema_even_when_signed(keys: tuple[Path, Path, KeyRing]) -> None:
    signing, _, ring = keys
    key = load_signing_key(signing)
    good = {
        "aud": "throughline",
        "scope": "read",
        "projects": ["/x"],
        "prefixes": [],
        "iat": NOW,
        "exp": NOW + 60,
        "jti": "ab",
    }
    bad_claims: list[object] = [
        dict(good, scope="root"),
        dict(good, extra=1),
        {k: v for k, v in good.items() if k != "exp"},
        dict(good, exp=float(NOW + 60)),
        dict(good, exp=True),
        dict(good, projects="/x"),
        dict(good, projects=[""]),
        [good],
        "text",
    ]
    for claims in bad_claims:
        body = b64encode(json.dumps(claims).encode())
        signed = f"tl1.{key.kid}.{body}"
        token = f"{signed}.{b64encode(key.private.sign(signed.encode()))}"
        with pytest.raises(TokenMalformedError):
            verify_token(token, ring, now=NOW)


def test_base64_must_be_canonical() -> None:
    assert b64decode(b64encode(b"\xff\x00")) == b"\xff\x00"
    assert b64decode("_wA") == b"\xff\x00"
    assert b64decode("_wB") is None  # same bytes, a non-zero unused bit
    assert b64decode("_wA=") is None and b64decode("A") is None and b64decode("AAAA\n") is None


def test_the_admin_token_is_admin_and_no_token_is_refused(keys: tuple[Path, Path, KeyRing]) -> None:
    _, _, ring = keys
    auth = BearerAuth("admin-token-0123456789abcdef", VerifiedTokens(ring, "throughline"))
    assert auth.check("Bearer admin-token-0123456789abcdef") == ADMIN
    for header in (None, "", "Basic xyz", "Bearer admin-token-0123456789abcdeF"):
        with pytest.raises(UnauthorizedError):
            auth.check(header)
    assert BearerAuth(None).check(None) == ADMIN  # no token configured: loopback-only serve


def test_cli_keygen_and_issue(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "throughline.cli", "token"]
    out = subprocess.run(
        [*cmd, "keygen", "--out", str(tmp_path / "k.json"), "--public-out", str(tmp_path / "k.pub")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    kid = out.stdout.strip()
    assert len(kid) == 16 and json.loads((tmp_path / "k.pub").read_text())["kid"] == kid
    issued = subprocess.run(
        [
            *cmd,
            "issue",
            "--key",
            str(tmp_path / "k.json"),
            "--project-prefix",
            "/srv/a/",
            "--expires",
            "2h",
            "--label",
            "ci",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    grant = verify_token(issued.stdout.strip(), KeyRing(tmp_path / "k.pub"))
    assert grant.prefixes == ("/srv/a/",) and grant.expires is not None
    refused = subprocess.run(
        [*cmd, "issue", "--key", str(tmp_path / "k.pub"), "--project", "/x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and json.loads(refused.stderr)["error"]["code"] == "invalid_token_key"
    refused = subprocess.run(
        [*cmd, "issue", "--key", str(tmp_path / "k.json")], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2 and json.loads(refused.stderr)["error"]["code"] == "invalid_token_request"


def test_the_key_watcher_reloads_on_change_and_on_sighup(tmp_path: Path, keys: tuple[Path, Path, KeyRing]) -> None:
    import time as _time

    from throughline.serve.security import KeyWatcher

    signing, folder, ring = keys
    first = ring.kids()
    with KeyWatcher(ring, poll=0.05) as watcher:
        generate_key_file(tmp_path / "k2.json", public_out=folder / "k2.pub")
        deadline = _time.monotonic() + 10
        while len(ring.kids()) < 2:
            assert _time.monotonic() < deadline, "a new key file was not picked up"
            _time.sleep(0.02)
        (folder / "broken.pub").write_text("{")  # a bad file: the keys in use stay
        _time.sleep(0.3)
        assert len(ring.kids()) == 2
        (folder / "broken.pub").unlink()
        (folder / "k1.pub").unlink()
        generation = ring.generation
        watcher._on_hup(1, None)  # what SIGHUP calls
        deadline = _time.monotonic() + 10
        while ring.generation == generation or first[0] in ring.kids():
            assert _time.monotonic() < deadline, "SIGHUP did not reload"
            _time.sleep(0.02)
    with pytest.raises(TokenUnknownKeyError):
        verify_token(_token(signing), ring, now=NOW)
