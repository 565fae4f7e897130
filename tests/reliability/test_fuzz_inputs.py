"""Bad input, fuzzed (docs/reliability.md#4-bad-input-fuzzed): every case ends in a typed error or a correct answer.

Targets, each counted (``rel_support.record("fuzz", ...)``):

- page tokens: EVERY single-bit flip of several valid tokens (of the token text, and of its decoded
  payload and MAC re-encoded canonically) is refused with ``PageTokenError``; for one token every flip
  also goes through the whole reader; every bit flip of the after and through cursors a token is
  bound to is refused too (``invalid_cursor`` or ``page_token_mismatch``, never a page);
- page tokens, generated: garbage, wrong shapes, and payloads of every wrong shape signed with the
  right key (the schema is checked after the MAC);
- cursors: garbage, mutated valid cursors and well-formed cursors with arbitrary fields;
- read parameters through ``read_observer_turn_page`` over the in-memory ``BookProjection``/``FixedLog``
  and over a real DuckDB projection of the same history: the two answers are identical, every
  ``ok`` page is true to the fold, and nothing but a typed error is raised;
- ingest lines through ``parse_turn_line``; raw topic records through ``decode_turn`` and through
  the projector's Kafka-free batch path (``DuckProjection.apply_batch``), whose result must equal a
  ``ChainBook`` fold of the same records (every record applied, a duplicate, or quarantined);
- HTTP requests through FastAPI's TestClient of the serve app (authentication off and on) and raw
  ASGI messages with arbitrary bytes: never a 500, never an unhandled exception, never a hang.

``THROUGHLINE_FUZZ_SCALE`` multiplies every generated target (the exhaustive ones are fixed).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import unicodedata
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import rel_support
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rel_world import KEY, OTHER_PROJECT, PROJECT, TOPIC, FixedWorld, build_world
from support.fold import fold_records

from throughline.core.chain import CHAIN_ORIGIN, content_digest, next_chain_digest
from throughline.core.cursor import Cursor, ForeignCursor, decode_cursor
from throughline.core.encoding import b64url_decode, b64url_encode
from throughline.core.exceptions import InvalidCursorError, PageTokenError
from throughline.core.fold import ChainBook
from throughline.core.identity import project_sha256
from throughline.core.memory import FixedLog
from throughline.core.page_token import SeriesBinding, issue_page_token, open_page_token
from throughline.core.turn import MAX_BODY_BYTES, TurnRecord, build_turn, parse_rfc3339
from throughline.errors import InputError, ThroughlineError
from throughline.producers.ingest import parse_turn_line
from throughline.projector.store import DuckProjection, LogRecord, prepare_batch
from throughline.reader import ObserverRead, SourceQuarantinedError, read_observer_turn_page
from throughline.schemas.codec import SCHEMAS, encode_datum, encode_turn, turn_to_avro
from throughline.schemas.exceptions import RecordDecodeError
from throughline.serve.app import ApiSettings, create_app

SCALE = rel_support.fuzz_scale()
READ_PATH = "/v1/projects/read"
AUTH = "fuzz-auth-token-0123456789abcdef"

#: Every code a read may be refused with (docs/design.md, docs/http.md).
READ_INPUT_CODES = {
    "invalid_limit",
    "invalid_project",
    "invalid_cursor",
    "invalid_body_limit",
    "invalid_wait",
    "page_token_unbound",
    "page_token_oversize",
    "page_token_version",
    "page_token_malformed",
    "page_token_tampered",
    "page_token_mismatch",
    "page_token_offset",
}
HTTP_CODES = READ_INPUT_CODES | {
    "invalid_arguments",
    "request_too_large",
    "unauthorized",
    "not_found",
    "method_not_allowed",
    "source_quarantined",
}
TOKEN_CODES = {c for c in READ_INPUT_CODES if c.startswith("page_token_")}
LINE_CODES = {
    "invalid_utf8",
    "invalid_json",
    "line_too_long",
    "invalid_turn",
    "body_too_large",
    "invalid_project",
}
RECORD_CODES = {"record_undecodable", "unknown_schema"}

COUNTS: dict[str, int] = {}
TARGETS = (
    "token_bit_flips",
    "token_bit_flips_through_reader",
    "binding_bit_flips",
    "token_generated",
    "cursor",
    "read_params_book",
    "read_params_duckdb",
    "ingest_line",
    "record_decode",
    "record_bit_flips",
    "record_apply",
    "http_testclient",
    "http_raw_asgi",
)


def count(target: str, n: int = 1) -> None:
    COUNTS[target] = COUNTS.get(target, 0) + n


def fuzz_settings(examples: int) -> Callable[[Any], Any]:
    """Hypothesis settings of one target: ``examples`` scaled, no deadline, failures replayable."""
    return settings(
        max_examples=max(1, int(examples * SCALE)),
        deadline=None,
        print_blob=True,
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


@pytest.fixture(scope="module", autouse=True)
def report_counts() -> Iterator[None]:
    yield
    for target, n in sorted(COUNTS.items()):
        rel_support.record("fuzz", target, cases=n)  # a case that failed raised before it was counted
    print(f"\nfuzz cases (scale {SCALE:g}): " + ", ".join(f"{k}={v}" for k, v in sorted(COUNTS.items())))


# ------------------------------------------------------------------------------------------ the world

WORLD: FixedWorld = build_world()
CURSORS = WORLD.all_cursors()
TOKENS = WORLD.tokens()
PROJECT_HASH = project_sha256(PROJECT)
BROKEN_SOURCES = set(WORLD.projection.book.broken)
KNOWN_SOURCES = list(WORLD.sources())


@pytest.fixture(scope="module")
def duck() -> Iterator[DuckProjection]:
    with WORLD.temporary_duck("fuzz") as projection:
        yield projection


# ------------------------------------------------------------------------------------------ helpers


def flip_bits(data: bytes) -> Iterator[bytes]:
    """Every single-bit flip of ``data``."""
    for i in range(len(data)):
        for bit in range(8):
            changed = bytearray(data)
            changed[i] ^= 1 << bit
            yield bytes(changed)


def token_variants(token: str) -> Iterator[str]:
    """Every single-bit flip of a token: of its text (bytes shown as latin-1), and of its decoded payload
    and MAC re-encoded canonically (so the change survives base64 and reaches the MAC check)."""
    for flipped in flip_bits(token.encode("ascii")):
        yield flipped.decode("latin-1")
    prefix, payload_text, tag_text = token.split(".")
    payload = b64url_decode(payload_text)
    tag = b64url_decode(tag_text)
    assert payload is not None and tag is not None
    for changed in flip_bits(payload):
        yield f"{prefix}.{b64url_encode(changed)}.{tag_text}"
    for changed in flip_bits(tag):
        yield f"{prefix}.{payload_text}.{b64url_encode(changed)}"


def read(projection: Any, log: Any = None, **params: Any) -> ObserverRead | ThroughlineError:
    """One read; a ``ThroughlineError`` is returned (typed), anything else propagates (unhandled)."""
    try:
        return read_observer_turn_page(
            projection=projection,
            log=log if log is not None else WORLD.log,
            token_key=KEY,
            wait_timeout=params.pop("wait_timeout", 0.0),
            **params,
        )
    except ThroughlineError as exc:
        return exc


def names_broken_source(*cursors: object) -> bool:
    for text in cursors:
        if isinstance(text, str):
            try:
                c = decode_cursor(text)
            except InvalidCursorError:
                continue
            if isinstance(c, Cursor) and c.source_sha256 in BROKEN_SOURCES:
                return True
    return False


def check_answer(result: ObserverRead | ThroughlineError, params: dict[str, Any]) -> None:
    """A read's outcome is a typed error or an answer true to the fold of the history."""
    if isinstance(result, ThroughlineError):
        if isinstance(result, InputError):
            assert result.code in READ_INPUT_CODES, result.code
        else:
            assert isinstance(result, SourceQuarantinedError), f"{result.code}: {result.message}"
            assert names_broken_source(params.get("after_cursor"), params.get("through_cursor"))
        assert result.message and "Traceback" not in result.message
        return
    assert ObserverRead.from_json(result.to_json()).to_dict() == result.to_dict()
    assert result.afterCursor == params.get("after_cursor")
    # The history is fully applied and the log ends where the projection does: never pending.
    assert result.status != "projection_pending", result.reason
    if result.status == "resync_required":
        assert result.reason and not result.turns
        return
    limit = params.get("limit") or 10
    if params.get("through_cursor") is not None:
        assert result.throughCursor == params["through_cursor"]
    elif result.throughCursor is not None:
        assert result.throughCursor == WORLD.head(PROJECT if _same_project(params["project"]) else OTHER_PROJECT)
    if result.throughCursor is None:
        assert not result.turns and result.page.complete
        return
    through = decode_cursor(result.throughCursor)
    assert isinstance(through, Cursor)
    live = WORLD.projection.book.live[through.source_sha256]
    assert 1 <= through.length <= len(live) and live[through.length - 1].chain_digest == through.chain_digest
    assert result.thread is not None and result.thread.sourceSha256 == through.source_sha256.hex()
    assert len(result.turns) <= limit
    body_limit = params.get("body_limit", 64 * 1024)
    for wire in result.turns:
        assert 1 <= wire.seq <= through.length
        book_turn = live[wire.seq - 1]
        full = book_turn.record.body.encode("utf-8")
        served = wire.body.encode("utf-8")
        assert wire.contentDigest == book_turn.content_digest.hex()
        assert wire.chainDigest == book_turn.chain_digest.hex()
        assert parse_rfc3339(wire.completedAt) == book_turn.record.completed_at_micros
        assert wire.bodyBytes == len(full)
        assert full.startswith(served) and len(served) <= body_limit
        assert wire.bodyTruncated == (len(full) > body_limit)
        if wire.bodyTruncated:
            assert len(served) > body_limit - 4  # cut at the last character boundary, no earlier
        else:
            assert served == full


def _same_project(project: object) -> bool:
    try:
        return isinstance(project, str) and project_sha256(project) == PROJECT_HASH
    except ThroughlineError:
        return False


# ------------------------------------------------------------------------------------------ page tokens


def test_every_single_bit_flip_of_a_token_is_refused() -> None:
    picked = TOKENS[:: max(1, len(TOKENS) // 6)][:6]
    assert len(picked) >= 4
    # Plus tokens of other keys, offsets and bindings, issued directly.
    rng = random.Random(5)
    extra = []
    for _ in range(2):
        through = rng.choice(CURSORS)
        after = rng.choice([None, *CURSORS])
        offset = rng.choice([0, 1, 99, 2**53 - 1])
        extra.append((issue_page_token(KEY, SeriesBinding.of(PROJECT_HASH, after, through), offset), after, through, 0))
    for token, after, through, _ in [*picked, *extra]:
        binding = SeriesBinding.of(PROJECT_HASH, after, through)
        open_page_token(KEY, token, binding)  # the original is accepted
        n = 0
        for variant in token_variants(token):
            assert variant != token
            with pytest.raises(PageTokenError) as refused:
                open_page_token(KEY, variant, binding)
            assert refused.value.code in TOKEN_CODES
            n += 1
        count("token_bit_flips", n)


def test_every_single_bit_flip_of_a_token_is_refused_by_the_reader() -> None:
    token, after, through, limit = TOKENS[len(TOKENS) // 2]
    ok = read(
        WORLD.projection, project=PROJECT, after_cursor=after, through_cursor=through, page_token=token, limit=limit
    )
    assert isinstance(ok, ObserverRead) and ok.ok
    n = 0
    for variant in token_variants(token):
        result = read(
            WORLD.projection,
            project=PROJECT,
            after_cursor=after,
            through_cursor=through,
            page_token=variant,
            limit=limit,
        )
        assert isinstance(result, PageTokenError), result  # a hard error: never a page, never resync
        n += 1
    count("token_bit_flips_through_reader", n)


def test_every_bit_flip_of_the_cursors_a_token_is_bound_to_is_refused() -> None:
    token, after, through, limit = next(t for t in TOKENS if t[1] is not None)
    assert after is not None
    n = 0
    for which, original in (("after_cursor", after), ("through_cursor", through)):
        for flipped in flip_bits(original.encode("ascii")):
            params = {"after_cursor": after, "through_cursor": through, which: flipped.decode("latin-1")}
            result = read(WORLD.projection, project=PROJECT, page_token=token, limit=limit, **params)
            assert isinstance(result, InputError), result
            assert result.code in {"invalid_cursor", "page_token_mismatch"}, result.code
            n += 1
    count("binding_bit_flips", n)


_HEX = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
_PAYLOAD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=70),
    _HEX,
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


@st.composite
def signed_payloads(draw: st.DrawFn) -> tuple[str, bool]:
    """A token signed with the right key whose payload may break the schema in any way."""
    binding = SeriesBinding.of(PROJECT_HASH, None, CURSORS[0])
    doc: dict[str, Any] = {
        "afterSha256": binding.after_sha256.hex(),
        "offset": draw(st.integers(0, 20)),
        "projectSha256": binding.project_sha256.hex(),
        "schema": "throughline.observer_page.v1",
        "throughSha256": binding.through_sha256.hex(),
    }
    valid = True
    for key in draw(st.lists(st.sampled_from(sorted(doc)), max_size=3, unique=True)):
        action = draw(st.sampled_from(["drop", "replace"]))
        if action == "drop":
            del doc[key]
        else:
            doc[key] = draw(_PAYLOAD_VALUES)
        valid = False
    if draw(st.booleans()) and draw(st.integers(0, 3)) == 0:
        doc[draw(st.text(min_size=1, max_size=8))] = draw(_PAYLOAD_VALUES)
        valid = False
    style = draw(st.sampled_from(["canonical", "spaced", "raw"]))
    if style == "canonical":
        payload = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    elif style == "spaced":
        payload = json.dumps(doc).encode()
    else:
        payload = draw(st.binary(max_size=300))
        valid = False
    import hashlib
    import hmac

    tag = hmac.new(KEY, b"throughline.observer_page.v1\x00" + payload, hashlib.sha256).digest()
    return f"tlp1.{b64url_encode(payload)}.{b64url_encode(tag)}", valid


_TOKENISH = st.one_of(
    st.text(max_size=60),
    st.text(alphabet="tlp0123456789.-_ABCDEFabcdef", max_size=80),
    st.builds(
        lambda v, a, b: f"tlp{v}.{a}.{b}",
        st.text("0123456789", min_size=1, max_size=5),
        st.text("ABCabc_-0123", max_size=40),
        st.text("ABCabc_-0123", max_size=45),
    ),
    st.sampled_from([t[0] for t in TOKENS]).map(lambda t: t + "\n"),
    st.sampled_from([t[0] for t in TOKENS]).map(lambda t: t.replace("tlp1.", "tlp2.", 1)),
    st.integers(0, 5).map(lambda n: "tlp1." + "A" * (4097 + n)),
    st.one_of(st.integers(), st.binary(max_size=10), st.none(), st.lists(st.text(), max_size=2)),
)


@fuzz_settings(1500)
@given(st.lists(st.one_of(_TOKENISH, signed_payloads()), min_size=1, max_size=4))
def test_generated_page_tokens_are_refused_or_exact(tokens: list[Any]) -> None:
    binding = SeriesBinding.of(PROJECT_HASH, None, CURSORS[0])
    for item in tokens:
        token, valid = item if isinstance(item, tuple) else (item, False)
        try:
            offset = open_page_token(KEY, token, binding)
        except PageTokenError as exc:
            assert exc.code in TOKEN_CODES
            if valid:
                raise AssertionError(f"a valid signed token was refused: {exc.code}") from None
        else:
            assert isinstance(offset, int) and not isinstance(offset, bool) and 0 <= offset <= 2**53 - 1
            payload = json.loads(b64url_decode(token.split(".")[1]) or b"")
            assert payload["offset"] == offset and set(payload) == {
                "afterSha256",
                "offset",
                "projectSha256",
                "schema",
                "throughSha256",
            }
        count("token_generated")


# ------------------------------------------------------------------------------------------ cursors


@st.composite
def forged_cursors(draw: st.DrawFn) -> str:
    """A well-formed cursor with arbitrary (or pool) fields."""
    project = draw(
        st.sampled_from([PROJECT_HASH, project_sha256(OTHER_PROJECT), bytes(32)]) | st.binary(min_size=32, max_size=32)
    )
    source = draw(st.sampled_from(KNOWN_SOURCES) | st.binary(min_size=32, max_size=32))
    length = draw(st.integers(1, 20) | st.integers(1, 2**63 - 1))
    digest = draw(st.binary(min_size=32, max_size=32))
    partition = draw(st.integers(0, 3) | st.integers(0, 2**31 - 1))
    offset = draw(st.integers(0, 40) | st.integers(0, 2**63 - 1))
    return Cursor(project, source, length, digest, partition, offset).encode()


def mutate_text(draw: st.DrawFn, text: str) -> str:
    how = draw(st.sampled_from(["flip", "cut", "extend", "insert", "case", "version", "pad", "swap"]))
    if not text:
        return text
    i = draw(st.integers(0, len(text) - 1))
    if how == "flip":
        return text[:i] + chr(ord(text[i]) ^ (1 << draw(st.integers(0, 6)))) + text[i + 1 :]
    if how == "cut":
        return text[:i]
    if how == "extend":
        return text + draw(st.text(max_size=4))
    if how == "insert":
        return text[:i] + draw(st.text(min_size=1, max_size=3)) + text[i:]
    if how == "case":
        return text.swapcase()
    if how == "version":
        return text.replace(
            "tlc1.", draw(st.sampled_from(["tlc2.", "tlc01.", "tlc0.", "tlc9999.", "TLC1.", "tlc1.."])), 1
        )
    if how == "pad":
        return text + draw(st.sampled_from(["=", "==", "\n", " ", "\x00"]))
    j = draw(st.integers(0, len(text) - 1))
    chars = list(text)
    chars[i], chars[j] = chars[j], chars[i]
    return "".join(chars)


@st.composite
def cursor_inputs(draw: st.DrawFn) -> object:
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return draw(st.sampled_from(CURSORS))
    if kind == 1:
        return mutate_text(draw, draw(st.sampled_from(CURSORS)))
    if kind == 2:
        return draw(forged_cursors())
    if kind == 3:
        return draw(st.text(max_size=200))
    if kind == 4:
        return "tlc" + draw(st.text("0123456789", max_size=5)) + "." + draw(st.text("A-Za-z09_-", max_size=200))
    return draw(
        st.one_of(
            st.none(),
            st.integers(),
            st.binary(max_size=20),
            st.floats(),
            st.lists(st.integers(), max_size=2),
            st.integers(1020, 1100).map(lambda n: "tlc1." + "A" * n),
        )
    )


@fuzz_settings(2500)
@given(st.lists(cursor_inputs(), min_size=1, max_size=10))
def test_cursors_decode_or_refuse(texts: list[object]) -> None:
    for text in texts:
        try:
            decoded = decode_cursor(text)
        except InvalidCursorError as exc:
            assert exc.code == "invalid_cursor" and exc.exit_code == 2
        else:
            assert isinstance(text, str)
            if isinstance(decoded, Cursor):
                assert decoded.encode() == text  # one spelling per cursor
            else:
                assert isinstance(decoded, ForeignCursor) and decoded.version != 1 and decoded.text == text
        count("cursor")


# ------------------------------------------------------------------------------------------ read parameters

_PROJECTS = st.one_of(
    st.sampled_from(
        [
            PROJECT,
            OTHER_PROJECT,
            PROJECT + "/",
            "/" + PROJECT,
            PROJECT.replace("/work/", "/work/./"),
            unicodedata.normalize("NFD", PROJECT),
            "/nope",
            "",
            ".",
            "/",
            "a\x00b",
            "/x\ud800",
            "x" * 5000,
        ]
    ),
    st.text(max_size=40),
    st.one_of(st.none(), st.integers(), st.binary(max_size=8), st.lists(st.text(), max_size=1)),
)
_LIMITS = st.one_of(
    st.none(),
    st.integers(1, 100),
    st.integers(-5, 200),
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.floats(allow_nan=True),
    st.text(max_size=4),
    st.sampled_from(["5", "10", b"3"]),
)
_BODY_LIMITS = st.one_of(
    st.just(64 * 1024), st.integers(0, 300), st.integers(-3, 10**9), st.booleans(), st.floats(), st.none()
)


@st.composite
def read_params(draw: st.DrawFn) -> dict[str, Any]:
    params: dict[str, Any] = {"project": draw(_PROJECTS)}
    shape = draw(st.integers(0, 9))
    if shape <= 4 and TOKENS:
        # A real series page, then maybe one thing changed.
        token, after, through, limit = draw(st.sampled_from(TOKENS))
        params.update(project=PROJECT, after_cursor=after, through_cursor=through, page_token=token, limit=limit)
        if shape >= 1:
            field = draw(st.sampled_from(["project", "after_cursor", "through_cursor", "page_token", "limit"]))
            params[field] = draw(
                {
                    "project": _PROJECTS,
                    "after_cursor": st.none() | cursor_inputs(),
                    "through_cursor": st.none() | cursor_inputs(),
                    "page_token": st.none() | _TOKENISH,
                    "limit": _LIMITS,
                }[field]
            )
    else:
        params["after_cursor"] = draw(st.none() | cursor_inputs())
        params["through_cursor"] = draw(st.none() | cursor_inputs())
        params["page_token"] = draw(st.none() | st.sampled_from([t[0] for t in TOKENS]) | _TOKENISH)
        params["limit"] = draw(_LIMITS)
    if draw(st.integers(0, 3)) == 0:
        params["body_limit"] = draw(_BODY_LIMITS)
    if draw(st.integers(0, 9)) == 0:
        params["wait_timeout"] = draw(st.sampled_from([-1.0, math.nan, math.inf, "1", True, 0]))
    return params


@fuzz_settings(2500)
@given(read_params())
def test_read_parameters_over_the_in_memory_projection(params: dict[str, Any]) -> None:
    result = read(WORLD.projection, **dict(params))
    check_answer(result, params)
    count("read_params_book")


@fuzz_settings(700)
@given(read_params())
def test_read_parameters_over_a_real_duckdb_projection(duck: DuckProjection, params: dict[str, Any]) -> None:
    book = read(WORLD.projection, **dict(params))
    result = read(duck, **dict(params))
    check_answer(result, params)
    if isinstance(book, ThroughlineError):
        assert isinstance(result, ThroughlineError) and (type(result), result.code) == (type(book), book.code)
    else:
        assert result == book and result.reason == book.reason  # both projections give the same answer
    count("read_params_duckdb", 2)


# ------------------------------------------------------------------------------------------ ingest lines

_FIELDS = ("project", "host", "thread", "turnId", "completedAt", "body")
_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
_TIMES = st.one_of(
    st.sampled_from(
        [
            "2026-01-02T03:04:05Z",
            "2026-01-02T03:04:05.123456789+05:30",
            "0001-01-01T00:00:00Z",
            "9999-12-31T23:59:60Z",
            "2026-02-30T00:00:00Z",
            "2026-01-02 03:04:05z",
            "2026-01-02T03:04:05",
            "2026-01-02T03:04:05Z\n",
            "２０２６-01-02T03:04:05Z",
            "0001-01-01T00:00:00+01:00",
        ]
    ),
    st.text(max_size=30),
)


@st.composite
def turn_lines(draw: st.DrawFn) -> bytes | str:
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return draw(st.binary(max_size=300))
    fields: dict[str, Any] = {
        "project": draw(st.sampled_from(["/srv/p", "p", "/a/../b", ""]) | st.text(max_size=12)),
        "host": draw(st.text(max_size=8) | st.just("h")),
        "thread": draw(st.text(max_size=8) | st.just("t")),
        "turnId": draw(st.text(max_size=8) | st.just("u1")),
        "completedAt": draw(_TIMES),
        "body": draw(st.text(max_size=40)),
    }
    if draw(st.booleans()):
        fields["seq"] = draw(st.integers(-3, 2**53 + 3) | st.sampled_from(["3", 1.0, True, None, 2**64]))
    if kind == 2:  # wrong types
        for key in draw(st.lists(st.sampled_from(sorted(fields)), max_size=3, unique=True)):
            fields[key] = draw(_JSON_VALUES)
    if kind == 3:  # missing and extra keys
        for key in draw(st.lists(st.sampled_from(_FIELDS), max_size=2, unique=True)):
            fields.pop(key, None)
        if draw(st.booleans()):
            fields[draw(st.text(min_size=1, max_size=6))] = draw(_JSON_VALUES)
    text = json.dumps(fields, ensure_ascii=draw(st.booleans()))
    if kind == 4:  # byte-level damage of an otherwise fine line
        data = bytearray(text.encode("utf-8"))
        for _ in range(draw(st.integers(1, 3))):
            if data:
                i = draw(st.integers(0, len(data) - 1))
                data[i] = draw(st.integers(0, 255))
        return bytes(data)
    if draw(st.integers(0, 9)) == 0:
        text = text[:-1] + ', "project": "dup"}'  # a duplicate key
    if draw(st.integers(0, 9)) == 0:
        text = "\ufeff" + text
    return text if draw(st.booleans()) else text.encode("utf-8")


def _parse_or_refuse(raw: bytes | str) -> tuple[TurnRecord | None, bool]:
    """``parse_turn_line(raw)`` and whether it refused the line; a refusal must carry a line error code."""
    try:
        return parse_turn_line(raw), False
    except InputError as exc:
        assert exc.code in LINE_CODES, exc.code
        return None, True


@fuzz_settings(1200)
@given(st.lists(turn_lines(), min_size=1, max_size=6))
def test_ingest_lines_parse_or_refuse(lines: list[bytes | str]) -> None:
    for raw in lines:
        turn, refused = _parse_or_refuse(raw)
        if turn is not None:
            text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
            doc = json.loads(text.lstrip("\ufeff"))
            rebuilt = build_turn(
                project=doc["project"],
                host=doc["host"],
                thread=doc["thread"],
                turn_id=doc["turnId"],
                completed_at_micros=parse_rfc3339(doc["completedAt"]),
                body=doc["body"],
                seq=doc.get("seq"),
            )
            assert (turn.project, turn.host, turn.thread, turn.turn_id, turn.seq, turn.body, turn.content_digest) == (
                rebuilt.project,
                rebuilt.host,
                rebuilt.thread,
                rebuilt.turn_id,
                rebuilt.seq,
                rebuilt.body,
                rebuilt.content_digest,
            )
        elif not refused:  # only a blank line parses to nothing
            assert not (raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw).lstrip("\ufeff").strip()
        count("ingest_line")


VALID_LINES = [
    json.dumps(
        {
            "project": "/srv/p",
            "host": "h",
            "thread": "t",
            "turnId": "u-1",
            "completedAt": "2026-01-02T03:04:05Z",
            "body": "hello ✓",
        },
        ensure_ascii=False,
    ),
    json.dumps(
        {
            "project": "p",
            "host": "host",
            "thread": "main",
            "turnId": "x",
            "seq": 3,
            "completedAt": "2026-01-02T03:04:05.123456+02:00",
            "body": "",
        }
    ),
    json.dumps(
        {
            "seq": 1,
            "body": "a\nb\u0000c",
            "completedAt": "1999-12-31T23:59:59.9Z",
            "turnId": "t",
            "thread": "s",
            "host": "h",
            "project": "/a/b/",
        }
    ),
]


def test_every_single_bit_flip_and_byte_deletion_of_an_ingest_line() -> None:
    n = 0
    for line in VALID_LINES:
        original = parse_turn_line(line.encode("utf-8"))
        assert original is not None
        data = line.encode("utf-8")
        deletions = (data[:i] + data[i + 1 :] for i in range(len(data)))
        for variant in [*flip_bits(data), *deletions]:
            turn, _ = _parse_or_refuse(variant)
            # A change that still parses (a letter of a string) yields the turn the line now says.
            if turn is not None:
                doc = json.loads(variant.decode("utf-8").lstrip("\ufeff"))
                assert (turn.host, turn.thread, turn.turn_id, turn.body, turn.seq) == (
                    doc["host"],
                    doc["thread"],
                    doc["turnId"],
                    doc["body"],
                    doc.get("seq"),
                )
            n += 1
    count("ingest_line", n)


def test_every_single_bit_flip_of_a_cursor_decodes_to_another_cursor_or_is_refused() -> None:
    n = 0
    for text in CURSORS[:: max(1, len(CURSORS) // 10)][:10]:
        original = decode_cursor(text)
        for variant in flip_bits(text.encode("ascii")):
            candidate = variant.decode("latin-1")
            try:
                decoded = decode_cursor(candidate)
            except InvalidCursorError:
                pass
            else:
                assert decoded != original and isinstance(decoded, Cursor | ForeignCursor)
                if isinstance(decoded, Cursor):
                    assert decoded.encode() == candidate
            n += 1
    count("cursor", n)


def test_an_overlong_ingest_line_is_refused_without_parsing() -> None:
    with pytest.raises(InputError) as refused:
        parse_turn_line(b"{" + b" " * (6 * MAX_BODY_BYTES + 64 * 1024))
    assert refused.value.code == "line_too_long"
    count("ingest_line")


# ------------------------------------------------------------------------------------------ topic records

SAMPLE = build_turn(
    project="/srv/fuzz",
    host="h",
    thread="t",
    turn_id="u-1",
    completed_at_micros=1_700_000_000_000_000,
    body="body ✓",
    seq=1,
    attributes={"k": "v"},
)


def _datum(draw: st.DrawFn, version: int) -> dict[str, Any]:
    """A datum of a schema version whose fields may be any value of their Avro type."""
    datum = turn_to_avro(SAMPLE)
    if version == 1:
        datum["producer"] = {k: v for k, v in datum["producer"].items() if k != "attributes"}
    text = st.text(max_size=12) | st.sampled_from(["", "a\x00b", "/srv/fuzz/", "/srv/../srv/fuzz"])
    choices = {
        "project": text,
        "host": text,
        "thread": text,
        "turnId": text,
        "body": st.text(max_size=30),
        "projectSha256": st.binary(max_size=40) | st.just(SAMPLE.project_sha256),
        "contentDigest": st.binary(max_size=40) | st.just(SAMPLE.content_digest),
        "seq": st.none() | st.integers(-(2**63), 2**63 - 1),
        "completedAt": st.integers(-(2**63), 2**63 - 1),
    }
    for key in draw(st.lists(st.sampled_from(sorted(choices)), max_size=3, unique=True)):
        datum[key] = draw(choices[key])
    return datum


@st.composite
def raw_records(draw: st.DrawFn) -> bytes | None:
    kind = draw(st.integers(0, 6))
    if kind == 0:
        return draw(st.binary(max_size=200))
    if kind == 1:  # a known header, then anything
        version = draw(st.sampled_from(sorted(SCHEMAS)))
        return b"\xc3\x01" + SCHEMAS[version].fingerprint + draw(st.binary(max_size=200))
    if kind == 2:  # an unknown fingerprint
        return b"\xc3\x01" + draw(st.binary(min_size=8, max_size=8)) + encode_turn(SAMPLE)[10:]
    if kind == 3:  # valid framing, fields of any value
        version = draw(st.sampled_from(sorted(SCHEMAS)))
        try:
            return encode_datum(_datum(draw, version), version)
        except Exception:  # a value Avro cannot write (e.g. a seq outside long); use the sample
            return encode_turn(SAMPLE)
    if kind == 4:  # a valid record, damaged
        data = bytearray(encode_turn(SAMPLE))
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
        return bytes(data)
    if kind == 5:  # truncated or extended
        data = encode_turn(SAMPLE)
        return (
            data[: draw(st.integers(0, len(data) - 1))]
            if draw(st.booleans())
            else data + draw(st.binary(min_size=1, max_size=8))
        )
    return None  # a tombstone


@fuzz_settings(1500)
@given(st.lists(raw_records(), min_size=1, max_size=6))
def test_raw_records_decode_or_refuse(values: list[bytes | None]) -> None:
    from throughline.schemas.codec import decode_turn

    for value in values:
        if value is None:
            continue
        try:
            turn = decode_turn(value)
        except RecordDecodeError as exc:
            assert exc.code in RECORD_CODES
        else:
            assert isinstance(turn, TurnRecord)
        count("record_decode")


def _apply_and_compare(projection: DuckProjection, records: list[LogRecord]) -> None:
    """Apply records through the batch path and compare with a ChainBook fold of the same records."""
    summary = projection.apply_batch(TOPIC, 0, records)
    book, undecodable = fold_records(records)
    # Every record is accounted for: applied, a duplicate, or quarantined.
    assert summary.records == len(records)
    assert summary.appended + summary.duplicates + summary.quarantined == summary.records
    assert summary.quarantined == len(book.quarantined) + len(undecodable)
    stats = projection.stats()
    assert stats.quarantined == summary.quarantined and stats.superseded == len(book.superseded)
    with projection.view() as view:
        assert view.applied_offset(0) == (records[-1].offset + 1 if records else 0)
        for source, turns in book.live.items():
            info = view.source(source)
            assert (
                info is not None
                and info.length == len(turns)
                and (info.broken_reason is not None) == (source in book.broken)
            )
            rows = view.turns(source, 1, max(1, len(turns)))
            assert [(r.seq, r.turn_id, r.chain_digest) for r in rows] == [
                (t.seq, t.turn_id, t.chain_digest) for t in turns
            ]
            previous = CHAIN_ORIGIN
            for row in rows:  # the stored chain is a real chain of the stored content
                previous = next_chain_digest(previous, content_digest(row.turn_id, row.completed_at_micros, row.body))
                assert previous == row.chain_digest


@st.composite
def record_batches(draw: st.DrawFn) -> list[LogRecord]:
    """A batch on partition 0: valid turns of a few sources (appends, rewinds, gaps, retries) mixed with raw junk."""
    out: list[LogRecord] = []
    n = draw(st.integers(1, 40))
    lengths: dict[tuple[str, str], int] = {}
    for offset in range(n):
        if draw(st.integers(0, 3)) == 0:
            value = draw(raw_records())
            key = draw(st.none() | st.just(SAMPLE.project_sha256) | st.binary(max_size=33))
            out.append(LogRecord(0, offset, key, value))
            continue
        host, thread = draw(st.sampled_from([("h", "t"), ("h", "u"), ("g", "t")]))
        length = lengths.get((host, thread), 0)
        seq = draw(st.none() | st.integers(1, length + 2))
        tid = draw(st.sampled_from([f"id-{offset}", "id-0", "id-1"]))
        body = draw(st.sampled_from(["a", "b", f"body {offset}"]))
        turn = build_turn(
            project="/srv/fuzz",
            host=host,
            thread=thread,
            turn_id=tid,
            completed_at_micros=1_700_000_000_000_000,
            body=body,
            seq=seq,
        )
        lengths[(host, thread)] = seq if seq is not None and seq <= length + 1 else length + 1
        key = turn.project_sha256 if draw(st.integers(0, 9)) else draw(st.binary(min_size=32, max_size=32))
        out.append(LogRecord(0, offset, key, encode_turn(turn)))
    return out


@fuzz_settings(150)
@given(record_batches())
def test_raw_records_through_the_projector_batch_path(batch: list[LogRecord]) -> None:
    projection = DuckProjection.open(":memory:", topic=TOPIC)
    try:
        _apply_and_compare(projection, batch)
        # A re-delivered batch changes nothing (exactly once).
        before = projection.table_digests()
        assert projection.apply_batch(TOPIC, 0, batch).records == 0
        assert projection.table_digests() == before
    finally:
        projection.close()
    count("record_apply", len(batch))


@pytest.mark.parametrize("project", ["", "a\x00b", ".", "x" * 5000])
def test_a_decoded_record_with_an_invalid_project_is_quarantined_as_invalid(project: str) -> None:
    # Found by the batch-path fuzz: verify_turn catches InvalidTurnError only, but canonical_project
    # raises InvalidProjectError (an InputError, not an InvalidTurnError), so ChainBook.apply raises
    # instead of rejecting, and the DuckDB store's catch-all files the record as "undecodable".
    datum = turn_to_avro(SAMPLE)
    datum["project"] = project
    value = encode_datum(datum, 2)
    from throughline.schemas.codec import decode_turn

    turn = decode_turn(value)  # it decodes: the bytes are a well-formed record
    book = ChainBook()
    outcome = book.apply(turn, 0, 0, partition_key=None)
    assert type(outcome).__name__ == "Reject" and len(book.quarantined) == 1
    prepared = prepare_batch(0, [LogRecord(0, 0, None, value)])
    refused = prepared.items[0]
    assert getattr(refused, "code", None) == "record_invalid", getattr(refused, "reason", refused)
    assert getattr(refused, "reason", "").startswith("invalid_project")
    count("record_decode")


def test_every_single_bit_flip_of_a_record_is_applied_soundly_or_quarantined() -> None:
    v2 = encode_turn(SAMPLE)
    v1_datum = turn_to_avro(SAMPLE)
    v1_datum["producer"] = {k: v for k, v in v1_datum["producer"].items() if k != "attributes"}
    v1 = encode_datum(v1_datum, 1)
    from throughline.schemas.codec import decode_turn

    n = 0
    for original in (v2, v1):
        assert decode_turn(original).content_digest == SAMPLE.content_digest
        variants = list(flip_bits(original))
        records = [LogRecord(0, i, SAMPLE.project_sha256, v) for i, v in enumerate(variants)]
        prepared = prepare_batch(0, records, partitions=1)
        assert len(prepared.items) == len(records)
        for start in range(0, len(records), 400):
            projection = DuckProjection.open(":memory:", topic=TOPIC)
            try:
                chunk = [LogRecord(0, i, r.key, r.value) for i, r in enumerate(records[start : start + 400])]
                _apply_and_compare(projection, chunk)
            finally:
                projection.close()
        n += len(variants)
    count("record_bit_flips", n)


# ------------------------------------------------------------------------------------------ HTTP

_PARAM_NAMES = st.sampled_from(
    ["project", "afterCursor", "throughCursor", "pageToken", "limit", "wait", "after", "through"]
) | st.text(max_size=8)


@st.composite
def param_values(draw: st.DrawFn) -> str:
    return str(
        draw(
            st.one_of(
                st.sampled_from([PROJECT, OTHER_PROJECT, *CURSORS[:5], *(t[0] for t in TOKENS[:5])]),
                cursor_inputs().filter(lambda v: isinstance(v, str)),
                st.sampled_from(
                    ["1", "10", "100", "0", "-1", "1e3", "0.001", "0.00", "99999999999999999999", "nan", "inf"]
                ),
                st.text(max_size=30),
            )
        )
    )


_JSON_PARAM_VALUES = st.one_of(
    param_values(),
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(max_value=0.01) | st.floats(allow_nan=True),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@st.composite
def http_requests(draw: st.DrawFn) -> dict[str, Any]:
    method = draw(st.sampled_from(["GET", "GET", "POST", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"]))
    path = draw(
        st.sampled_from(
            [
                READ_PATH,
                READ_PATH,
                READ_PATH,
                "/healthz",
                "/readyz",
                "/metrics",
                "/openapi.json",
                READ_PATH + "/",
                "/v1/projects",
                "/",
                "/v1/projects/read/x",
            ]
        )
        | st.text("/abc%.", max_size=12).map(lambda s: "/v1/" + s)
    )  # (httpx refuses a path that starts "//")
    headers: dict[str, str] = {}
    auth = draw(st.sampled_from(["none", "good", "bad", "scheme", "junk"]))
    if auth == "good":
        headers["Authorization"] = f"Bearer {AUTH}"
    elif auth == "bad":
        headers["Authorization"] = f"Bearer {AUTH[:-1]}x"
    elif auth == "scheme":
        headers["Authorization"] = f"Basic {AUTH}"
    elif auth == "junk":
        headers["Authorization"] = draw(
            st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=30)
        )
    request: dict[str, Any] = {"method": method, "url": path, "headers": headers}
    if draw(st.booleans()):
        pairs = draw(st.lists(st.tuples(_PARAM_NAMES, param_values()), max_size=6))
        request["params"] = pairs
    if method in ("POST", "PUT", "PATCH"):
        body_kind = draw(st.integers(0, 4))
        if body_kind <= 2:
            doc = {name: draw(_JSON_PARAM_VALUES) for name in draw(st.lists(_PARAM_NAMES, max_size=6, unique=True))}
            request["content"] = json.dumps(doc).encode()
        elif body_kind == 3:
            request["content"] = draw(st.binary(max_size=200))
        else:
            request["content"] = draw(
                st.sampled_from(
                    [
                        b"[" * 3000,
                        b"{" * 3000,
                        b'{"project":' * 2000,
                        b"null",
                        b"[]",
                        b'{"project": "\\ud800"}',
                        b"x" * 70_000,
                        b'{"limit": 1' + b"0" * 5000 + b"}",
                    ]
                )
            )
        headers["Content-Type"] = draw(
            st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded", ""])
        )
    return request


def _check_http(response: Any, request: dict[str, Any], *, auth_on: bool) -> None:
    assert response.status_code != 500, f"{request} -> 500: {response.text[:300]}"
    assert response.status_code in {200, 400, 401, 404, 405, 409, 413, 414, 503}, (request, response.status_code)
    if request["method"] == "HEAD":
        return
    if response.status_code == 200:
        if request["url"] == READ_PATH and request["method"] in ("GET", "POST"):
            ObserverRead.from_json(response.content)
        return
    document = response.json()
    assert set(document) == {"error"} and set(document["error"]) == {"code", "message"}, document
    assert document["error"]["code"] in HTTP_CODES, document
    assert "Traceback" not in response.text
    if auth_on and request["url"] == READ_PATH and request["method"] in ("GET", "POST"):
        good = request["headers"].get("Authorization") == f"Bearer {AUTH}"
        if not good and response.status_code not in (413, 414):
            assert response.status_code == 401, document


@pytest.fixture(scope="module")
def clients() -> Iterator[tuple[TestClient, TestClient]]:
    api = {"read_wait": 0.0, "max_wait": 0.01}
    open_app = create_app(projection=WORLD.projection, log=WORLD.log, token_key=KEY, settings=ApiSettings(**api))
    auth_app = create_app(
        projection=WORLD.projection, log=WORLD.log, token_key=KEY, settings=ApiSettings(auth_token=AUTH, **api)
    )
    with (
        TestClient(open_app, raise_server_exceptions=False) as a,
        TestClient(auth_app, raise_server_exceptions=False) as b,
    ):
        yield a, b


@fuzz_settings(1500)
@given(http_requests(), st.booleans())
def test_http_requests_never_fail_the_server(
    clients: tuple[TestClient, TestClient], request: dict[str, Any], auth_on: bool
) -> None:
    client = clients[1] if auth_on else clients[0]
    response = client.request(**request)
    _check_http(response, request, auth_on=auth_on)
    count("http_testclient")


_RAW_METHODS = st.sampled_from(["GET", "POST", "HEAD", "PUT", "OPTIONS"]) | st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=1, max_size=7
)


@st.composite
def asgi_requests(draw: st.DrawFn) -> tuple[dict[str, Any], list[bytes]]:
    path = draw(
        st.sampled_from([READ_PATH, "/healthz", "/readyz", "/metrics"]) | st.text(max_size=20).map(lambda s: "/" + s)
    )
    query = draw(
        st.one_of(
            st.binary(max_size=120),
            st.lists(st.tuples(_PARAM_NAMES, param_values()), max_size=5).map(
                lambda pairs: "&".join(f"{k}={v}" for k, v in pairs).encode("utf-8", "surrogateescape")
            ),
            st.integers(16 * 1024, 17 * 1024).map(lambda n: b"project=" + b"a" * n),
        )
    )
    headers = draw(
        st.lists(
            st.tuples(
                st.sampled_from([b"content-length", b"content-type", b"authorization", b"host", b"transfer-encoding"])
                | st.binary(min_size=1, max_size=10).map(bytes.lower),
                st.binary(max_size=40) | st.sampled_from([b"0", b"10", b"99999999999999999999", b"-1", b"1 ", b"\xff"]),
            ),
            max_size=4,
        )
    )
    chunks = draw(st.lists(st.binary(max_size=100) | st.sampled_from([b'{"project": "/p"}', b"[" * 2000]), max_size=3))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": draw(_RAW_METHODS),
        "scheme": "http",
        "path": path,
        "raw_path": path.encode("utf-8", "surrogateescape"),
        "query_string": query,
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8787),
    }
    return scope, chunks


@pytest.fixture(scope="module")
def asgi_loop() -> Iterator[tuple[asyncio.AbstractEventLoop, Any]]:
    loop = asyncio.new_event_loop()
    app = create_app(
        projection=WORLD.projection, log=WORLD.log, token_key=KEY, settings=ApiSettings(read_wait=0.0, max_wait=0.01)
    )
    try:
        yield loop, app
    finally:
        loop.close()


@fuzz_settings(1500)
@given(asgi_requests())
def test_raw_asgi_requests_never_fail_the_server(
    asgi_loop: tuple[asyncio.AbstractEventLoop, Any], request: tuple[dict[str, Any], list[bytes]]
) -> None:
    loop, app = asgi_loop
    scope, chunks = request
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1} for i, chunk in enumerate(chunks)
    ] or [{"type": "http.request", "body": b"", "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(0)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    loop.run_until_complete(asyncio.wait_for(app(scope, receive, send), timeout=30))
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert len(starts) == 1, sent[:2]
    assert starts[0]["status"] != 500, (scope, b"".join(m.get("body", b"") for m in sent)[:300])
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    assert bodies and not bodies[-1].get("more_body", False)  # the answer was finished
    count("http_raw_asgi")


# ------------------------------------------------------------------------------------------ totals


def test_fixed_log_is_the_world_log() -> None:
    # Guard: the fuzzed reads above use a log whose end offsets are exactly what was projected.
    assert isinstance(WORLD.log, FixedLog)
    with WORLD.projection.view() as view:
        for p, end in WORLD.log.ends.items():
            assert view.applied_offset(p) == end


def test_fuzz_total_is_at_least_100k_cases() -> None:
    ran = [t for t in TARGETS if t in COUNTS]
    if len(ran) < len(TARGETS) or SCALE < 1:
        return  # a partial run (-k, or a scale below 1): the total is only asserted for the whole module
    total = sum(COUNTS.values())
    print(f"\nfuzz total: {total} cases")
    assert total >= 100_000, COUNTS
