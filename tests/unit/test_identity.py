"""Canonical project names, project hashes and hash-only source identities."""

from __future__ import annotations

import hashlib
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from throughline.core.exceptions import InvalidProjectError, InvalidTurnError
from throughline.core.identity import (
    MAX_NAME_CHARS,
    MAX_PROJECT_CHARS,
    SourceKey,
    canonical_project,
    project_sha256,
    source_sha256,
    validate_name,
)
from throughline.errors import InputError

names = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), min_size=1, max_size=30)


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("project", "project"),
        ("/work/app", "/work/app"),
        ("/work/app/", "/work/app"),
        ("/work//app///", "/work/app"),
        ("/work/./app/.", "/work/app"),
        ("/work/tmp/../app", "/work/app"),
        ("work/app/", "work/app"),
        ("./work/app", "work/app"),
        ("a/b/../../c", "c"),
        ("/", "/"),
        ("///", "/"),
        ("//srv/app", "/srv/app"),
        ("/..", "/"),
        ("/../a", "/a"),
        ("e\u0301t\u00e9/", "\u00e9t\u00e9"),  # NFD -> NFC, then the path rule
        ("caf\u0065\u0301", "caf\u00e9"),  # NFC without a slash
        (" a", " a"),  # surrounding whitespace is kept on purpose
        ("a ", "a "),
        ("C:\\work\\app", "C:\\work\\app"),  # only '/' separates path segments
    ],
)
def test_canonical_project(raw: str, canonical: str) -> None:
    assert canonical_project(raw) == canonical


def test_nfc_and_nfd_spellings_are_one_project() -> None:
    nfd = unicodedata.normalize("NFD", "/Users/zoë/プロジェクト")
    nfc = unicodedata.normalize("NFC", "/Users/zoë/プロジェクト")
    assert nfd != nfc
    assert project_sha256(nfd) == project_sha256(nfc)


def test_project_hash_is_sha256_of_the_canonical_utf8() -> None:
    assert project_sha256("/work/app/") == hashlib.sha256(b"/work/app").digest()
    assert project_sha256("\u00e9") == hashlib.sha256("\u00e9".encode()).digest()
    assert len(project_sha256("x")) == 32


@pytest.mark.parametrize("raw", ["", ".", "./", "a/..", "a/b/../..", "x\x00y", "a" * (MAX_PROJECT_CHARS + 1)])
def test_invalid_projects(raw: str) -> None:
    with pytest.raises(InvalidProjectError) as info:
        canonical_project(raw)
    assert info.value.code == "invalid_project"
    assert info.value.exit_code == 2


@pytest.mark.parametrize("raw", [None, 1, b"/work/app", ["a"]])
def test_non_string_projects(raw: object) -> None:
    with pytest.raises(InvalidProjectError):
        canonical_project(raw)  # type: ignore[arg-type]


def test_lone_surrogate_project_is_an_input_error() -> None:
    with pytest.raises(InputError):
        canonical_project("/work/\ud800")


def test_project_at_the_length_limit() -> None:
    assert canonical_project("a" * MAX_PROJECT_CHARS) == "a" * MAX_PROJECT_CHARS


@given(names)
def test_canonical_form_is_idempotent_and_has_no_trailing_slash(raw: str) -> None:
    try:
        canonical = canonical_project(raw)
    except InvalidProjectError:
        return
    assert canonical_project(canonical) == canonical
    assert unicodedata.is_normalized("NFC", canonical)
    if "/" in canonical and canonical != "/":
        assert not canonical.endswith("/")
        assert "//" not in canonical
        assert "/./" not in canonical + "/" and "/../" not in canonical + "/"


@given(names, names)
def test_source_identity_changes_with_host_and_thread(host: str, thread: str) -> None:
    p = project_sha256("/work/app")
    s = source_sha256(p, host, thread)
    assert len(s) == 32
    assert source_sha256(p, host + "x", thread) != s
    assert source_sha256(p, host, thread + "x") != s


def test_source_identity_keeps_host_and_thread_apart() -> None:
    p = project_sha256("p")
    assert source_sha256(p, "ab", "c") != source_sha256(p, "a", "bc")
    assert source_sha256(p, "h", "t") != source_sha256(p, "t", "h")


def test_same_host_and_thread_under_two_projects_are_two_sources() -> None:
    assert SourceKey.of("/one", "h", "t").source_sha256 != SourceKey.of("/two", "h", "t").source_sha256
    assert SourceKey.of("/one/", "h", "t") == SourceKey.of("/one", "h", "t")


def test_source_sha256_needs_a_project_hash() -> None:
    with pytest.raises(ValueError):
        source_sha256(b"short", "h", "t")


@pytest.mark.parametrize("value", ["", None, 3, "x" * (MAX_NAME_CHARS + 1), "a\x00b", "\udc00"])
def test_invalid_names(value: object) -> None:
    with pytest.raises(InvalidTurnError):
        validate_name(value, "host")


def test_valid_names() -> None:
    assert validate_name("x" * MAX_NAME_CHARS, "thread") == "x" * MAX_NAME_CHARS
    assert validate_name(" spaced name ✓ ", "host") == " spaced name ✓ "
