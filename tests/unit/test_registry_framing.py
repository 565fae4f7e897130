"""The Confluent wire format (magic 0, 4-byte schema id, Avro body) beside single-object encoding:
golden bytes per schema version, both framings in every decoder, schema ids resolved once through the
registry (bounded cache, typed errors), an unknown id quarantined like an unknown fingerprint, and a
registry that is away retried, never quarantined. The registry client's HTTP handling is checked
against a loopback HTTP server that answers as a registry's error paths do (the integration tier
runs a real registry: tests/integration/test_schema_registry.py)."""

from __future__ import annotations

import http.server
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.certs import Pki, make_pki
from test_codec import BASE, DATUM_V1, DATUM_V2, GOLDEN_V1, GOLDEN_V2

from throughline.core.repair import RepairRecord
from throughline.core.turn import ProducerStamp, build_turn
from throughline.errors import ConfigurationError
from throughline.log.config import config_from_properties, parse_properties
from throughline.projector.prepare import LogRecord, RefusedRecord, SoundRecord, prepare_batch
from throughline.schemas import codec, registry
from throughline.schemas.codec import (
    CURRENT_REPAIR_VERSION,
    REPAIR,
    REPAIR_SCHEMAS,
    SCHEMAS,
    confluent_header,
    decode_log_datum,
    decode_record,
    decode_turn,
    encode_datum,
    encode_repair,
    encode_turn,
    writer_schema,
)
from throughline.schemas.exceptions import (
    RecordDecodeError,
    RegistryError,
    RegistryUnavailableError,
    SchemaIncompatibleError,
    UnknownSchemaIdError,
)
from throughline.settings import Settings

#: The single-object golden records with their 10-byte header replaced by ``00 00000007`` (schema id 7).
CONFLUENT_V1 = "0000000007" + GOLDEN_V1[20:]
CONFLUENT_V2 = "0000000007" + GOLDEN_V2[20:]


@pytest.fixture
def ids() -> Iterator[registry.SchemaIds]:
    """A process resolver with no registry behind it (ids are ``remember``ed), restored afterwards."""
    before = codec.schema_ids()
    resolver = registry.SchemaIds(None)
    codec.set_schema_ids(resolver)
    try:
        yield resolver
    finally:
        codec.set_schema_ids(before)


def test_confluent_golden_bytes_of_each_schema_version() -> None:
    assert encode_datum(DATUM_V1, 1, schema_id=7).hex() == CONFLUENT_V1
    assert encode_datum(DATUM_V2, 2, schema_id=7).hex() == CONFLUENT_V2
    assert confluent_header(7) == b"\x00\x00\x00\x00\x07"
    assert confluent_header(0x01020304) == b"\x00\x01\x02\x03\x04"  # big-endian, as Confluent's serializer writes
    with pytest.raises(ValueError):
        confluent_header(1 << 32)


def test_encode_turn_behind_a_confluent_header_is_the_golden_record() -> None:
    turn = decode_turn(bytes.fromhex(GOLDEN_V2))
    assert encode_turn(turn, confluent_header(7)).hex() == CONFLUENT_V2


def test_repair_golden_bytes_in_both_framings(ids: registry.SchemaIds) -> None:
    repair = RepairRecord(bytes(range(32)), bytes(range(1, 33)), "fixed", ProducerStamp("golden", "1", 5, {}))
    single = encode_repair(repair)
    framed = encode_repair(repair, confluent_header(9))
    assert framed == b"\x00\x00\x00\x00\x09" + single[10:]
    ids.remember(9, REPAIR_SCHEMAS[CURRENT_REPAIR_VERSION])
    assert decode_record(framed) == decode_record(single) == repair
    assert decode_log_datum(framed) == repair


def test_both_framings_decode_to_the_same_datum(ids: registry.SchemaIds) -> None:
    ids.remember(7, SCHEMAS[2])
    ids.remember(8, SCHEMAS[1])
    v1_framed = "0000000008" + GOLDEN_V1[20:]
    assert decode_log_datum(bytes.fromhex(CONFLUENT_V2)) == decode_log_datum(bytes.fromhex(GOLDEN_V2))
    assert decode_turn(bytes.fromhex(v1_framed)) == decode_turn(bytes.fromhex(GOLDEN_V1))  # v1 resolved into v2's shape
    assert writer_schema(bytes.fromhex(v1_framed)).version == 1


def test_a_registry_framed_record_without_a_registry_is_an_unknown_schema() -> None:
    before = codec.schema_ids()
    codec.set_schema_ids(None)
    try:
        with pytest.raises(UnknownSchemaIdError, match="no schema registry is configured") as info:
            decode_log_datum(bytes.fromhex(CONFLUENT_V2))
    finally:
        codec.set_schema_ids(before)
    assert info.value.code == "unknown_schema"
    assert isinstance(info.value, RecordDecodeError)


def test_every_truncation_of_a_registry_framed_record_is_a_record_decode_error(
    ids: registry.SchemaIds,
) -> None:
    ids.remember(7, SCHEMAS[2])
    data = bytes.fromhex(CONFLUENT_V2)
    for cut in range(len(data)):
        with pytest.raises(RecordDecodeError):
            decode_turn(data[:cut])


class _Client:
    """A registry client answering from a dict (the cache and mapping tests need no HTTP)."""

    def __init__(self, schemas: dict[int, str], *, away: bool = False) -> None:
        self.schemas = schemas
        self.away = away
        self.settings = registry.RegistrySettings("http://127.0.0.1:9")

    def schema_text(self, schema_id: int) -> str | None:
        if self.away:
            raise RegistryUnavailableError("schema registry http://127.0.0.1:9 did not answer")
        return self.schemas.get(schema_id)


def _resolver(client: _Client, max_entries: int = registry.MAX_CACHED_IDS) -> registry.SchemaIds:
    return registry.SchemaIds(client, max_entries)  # type: ignore[arg-type]


def test_an_id_is_looked_up_once_and_mapped_by_fingerprint() -> None:
    foreign = json.dumps({"type": "record", "name": "Other", "fields": [{"name": "a", "type": "int"}]})
    ids = _resolver(_Client({3: registry.schema_text(SCHEMAS[2]), 4: foreign}))
    assert ids.resolve(3) is SCHEMAS[2]
    assert ids.resolve(3) is SCHEMAS[2]
    assert ids.lookups == 1
    with pytest.raises(UnknownSchemaIdError, match="does not know"):
        ids.resolve(4)
    with pytest.raises(UnknownSchemaIdError, match="not in the schema registry"):
        ids.resolve(5)
    with pytest.raises(UnknownSchemaIdError):
        ids.resolve(5)
    assert ids.lookups == 3  # an unknown id is remembered too


def test_a_schema_text_with_other_formatting_maps_onto_the_same_schema() -> None:
    # A registry may hand back the schema reformatted (Apicurio keeps the text, others canonicalise it).
    pretty = json.dumps(SCHEMAS[1].source, indent=2)
    assert registry.known_schema(pretty) is SCHEMAS[1]
    assert registry.known_schema("not json") is None


def test_the_cache_is_bounded() -> None:
    ids = _resolver(_Client({n: registry.schema_text(SCHEMAS[2]) for n in range(10)}), max_entries=4)
    for n in range(10):
        ids.resolve(n)
    assert len(ids._known) == 4


TURN = build_turn(project="/a/b", host="host", thread="thread", turn_id="x", completed_at_micros=42, body="body", seq=1)


def _batch(values: list[bytes]) -> list[LogRecord]:
    return [LogRecord(0, i, TURN.project_sha256, v) for i, v in enumerate(values)]


def test_an_unknown_id_is_quarantined_and_the_other_records_project(ids: registry.SchemaIds) -> None:
    ids.remember(7, SCHEMAS[2])
    single = encode_turn(TURN)
    unknown = encode_turn(TURN, confluent_header(255))
    batch = prepare_batch(0, _batch([single, unknown, encode_turn(TURN, confluent_header(7))]))
    kinds = [type(it) for it in batch.items]
    assert kinds == [SoundRecord, RefusedRecord, SoundRecord]
    refused = batch.items[1]
    assert isinstance(refused, RefusedRecord)
    assert refused.code == "unknown_schema" and "255" in refused.reason
    assert batch.items[0][3:] == batch.items[2][3:]  # the same turn, whichever framing carried it


def test_a_registry_that_is_away_is_retried_never_quarantined() -> None:
    before = codec.schema_ids()
    codec.set_schema_ids(_resolver(_Client({}, away=True)))
    try:
        with pytest.raises(RegistryUnavailableError) as info:
            prepare_batch(0, _batch([encode_turn(TURN), encode_turn(TURN, confluent_header(7))]))
    finally:
        codec.set_schema_ids(before)
    assert info.value.retriable and info.value.code == "registry_unavailable"


def test_the_single_object_fast_path_never_asks_the_resolver() -> None:
    before = codec.schema_ids()
    codec.set_schema_ids(_resolver(_Client({}, away=True)))
    try:
        assert decode_log_datum(bytes.fromhex(GOLDEN_V2))["turnId"] == BASE["turnId"]
        assert decode_turn(bytes.fromhex(GOLDEN_V1)).turn_id == BASE["turnId"]
    finally:
        codec.set_schema_ids(before)


# ------------------------------------------------------------------------------- the HTTP client


class _Handler(http.server.BaseHTTPRequestHandler):
    answers: dict[tuple[str, str], tuple[int, object]] = {}
    seen: list[tuple[str, str, str | None]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.seen.append((self.command, self.path, self.headers.get("Authorization")))
        status, payload = self.answers.get((self.command, self.path.split("?")[0]), (404, {"error_code": 40403}))
        if isinstance(payload, dict) and payload.get("echo"):
            payload = {"schema": json.loads(body)["schema"]}
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    _Handler.answers = {}
    _Handler.seen = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/apis/ccompat/v7"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _client(url: str, **kw: object) -> registry.RegistryClient:
    return registry.RegistryClient(registry.RegistrySettings(url, timeout_s=2.0, **kw), sleep=lambda s: None)  # type: ignore[arg-type]


def test_the_client_reads_a_schema_by_id_with_basic_auth(server: str) -> None:
    text = registry.schema_text(SCHEMAS[2])
    _Handler.answers[("GET", "/apis/ccompat/v7/schemas/ids/12")] = (200, {"schema": text})
    client = _client(server, user_info="user:pa55")
    assert client.schema_text(12) == text
    assert client.schema_text(13) is None
    assert _Handler.seen[0][2] == "Basic dXNlcjpwYTU1"


def test_5xx_is_retried_then_unavailable_and_401_is_a_registry_error(server: str) -> None:
    _Handler.answers[("GET", "/apis/ccompat/v7/schemas/ids/1")] = (503, {"message": "down"})
    _Handler.answers[("GET", "/apis/ccompat/v7/schemas/ids/2")] = (401, {"message": "no"})
    client = _client(server, user_info="user:pa55")
    with pytest.raises(RegistryUnavailableError, match="after 3 attempts"):
        client.schema_text(1)
    assert len(_Handler.seen) == 3
    with pytest.raises(RegistryError, match="refused the credentials") as info:
        client.schema_text(2)
    assert "pa55" not in info.value.message and not isinstance(info.value, RegistryUnavailableError)


def test_no_registry_listening_is_unavailable() -> None:
    client = _client("http://127.0.0.1:9/")  # the discard port: nothing listens on loopback
    with pytest.raises(RegistryUnavailableError):
        client.schema_text(1)


def test_an_incompatible_schema_is_refused_before_registering(server: str) -> None:
    subject = "/apis/ccompat/v7/compatibility/subjects/t-value/versions/latest"
    _Handler.answers[("GET", "/apis/ccompat/v7/config/t-value")] = (200, {"compatibilityLevel": "BACKWARD"})
    _Handler.answers[("POST", subject)] = (200, {"is_compatible": False, "messages": ["field removed"]})
    settings = registry.RegistrySettings(server, timeout_s=2.0)
    before = codec.schema_ids()
    try:
        with pytest.raises(SchemaIncompatibleError, match="field removed") as info:
            registry.register_writer_schemas(settings, "t")
    finally:
        codec.set_schema_ids(before)
    assert info.value.exit_code == 2
    assert not any(p.endswith("/versions") for _, p, _ in _Handler.seen)  # nothing registered


def test_a_new_subject_gets_backward_and_the_ids_are_remembered(server: str) -> None:
    base = "/apis/ccompat/v7"
    repair_subject = registry.repair_subject("t")
    assert repair_subject == "t-throughline.log.SourceRepair"
    _Handler.answers[("PUT", f"{base}/config/t-value")] = (200, {"compatibility": "BACKWARD"})
    _Handler.answers[("PUT", f"{base}/config/{repair_subject}")] = (200, {"compatibility": "BACKWARD"})
    _Handler.answers[("POST", f"{base}/subjects/t-value/versions")] = (200, {"id": 21})
    _Handler.answers[("POST", f"{base}/subjects/{repair_subject}/versions")] = (200, {"id": 22})
    before = codec.schema_ids()
    try:
        headers = registry.register_writer_schemas(registry.RegistrySettings(server, timeout_s=2.0), "t")
        assert (headers.turn, headers.repair) == (confluent_header(21), confluent_header(22))
        assert writer_schema(encode_turn(decode_turn(bytes.fromhex(GOLDEN_V2)), headers.turn)) is SCHEMAS[2]
        assert writer_schema(headers.repair + b"").family == REPAIR
    finally:
        codec.set_schema_ids(before)
    puts = [(m, p) for m, p, _ in _Handler.seen if m == "PUT"]
    assert puts == [("PUT", f"{base}/config/t-value"), ("PUT", f"{base}/config/{repair_subject}")]


# ------------------------------------------------------------------------------- configuration


def test_registry_properties_are_read_and_checked(tmp_path: Path) -> None:
    text = (
        "schema.registry.url=https://registry.example:8081\n"
        "basic.auth.credentials.source=USER_INFO\n"
        "schema.registry.basic.auth.user.info=svc:s3cret\n"
        "schema.registry.ssl.endpoint.identification.algorithm=\n"
    )
    config = config_from_properties(parse_properties(text), source="c.properties", base=tmp_path)
    assert config.schema_registry is not None
    assert config.schema_registry.url == "https://registry.example:8081"
    assert config.schema_registry.user_info == "svc:s3cret"
    assert not config.schema_registry.check_hostname
    assert "s3cret" in config.secrets() and "s3cret" not in repr(config)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("basic.auth.user.info=a:b\n", "without schema.registry.url"),
        ("schema.registry.url=ftp://x\n", "http:// or https://"),
        ("schema.registry.url=http://a:b@x\n", "must not carry credentials"),
        ("schema.registry.url=http://x\nbasic.auth.user.info=nocolon\n", "user:password"),
        ("schema.registry.url=http://x\nschema.registry.ssl.ca.location=/ca.pem\n", "not https"),
        ("schema.registry.url=http://x,http://y\n", "one registry URL"),
        ("schema.registry.url=http://x\nbasic.auth.credentials.source=SASL_INHERIT\n", "USER_INFO"),
    ],
)
def test_bad_registry_properties_are_configuration_errors(text: str, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        config_from_properties(parse_properties(text), source="c.properties")


def test_the_flag_sets_the_url_and_keeps_the_files_auth(tmp_path: Path) -> None:
    props = tmp_path / "client.properties"
    props.write_text("schema.registry.url=http://old:8081\nbasic.auth.user.info=u:p\n", "utf-8")
    config = Settings(
        None, "t", "d", str(props), schema_registry_url="http://127.0.0.1:8085/apis/ccompat/v7"
    ).kafka_config()
    assert config.schema_registry is not None
    assert config.schema_registry.url == "http://127.0.0.1:8085/apis/ccompat/v7"
    assert config.schema_registry.user_info == "u:p"
    assert Settings(None, "t", "d").kafka_config().schema_registry is None


# ------------------------------------------------------------------------------- TLS and totality


def _https_server(pki: Pki) -> tuple[http.server.ThreadingHTTPServer, threading.Thread]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.cert, pki.key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    return httpd, thread


def test_https_with_the_properties_files_ca_and_an_untrusted_one(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    _Handler.answers = {("GET", "/schemas/ids/1"): (200, {"schema": registry.schema_text(SCHEMAS[2])})}
    _Handler.seen = []
    httpd, thread = _https_server(pki)
    try:
        url = f"https://127.0.0.1:{httpd.server_address[1]}"
        props = f"schema.registry.url={url}\nschema.registry.ssl.ca.location={pki.ca}\n"
        config = config_from_properties(parse_properties(props), source="c.properties", base=tmp_path)
        assert config.schema_registry is not None
        assert registry.SchemaIds(registry.RegistryClient(config.schema_registry)).resolve(1) is SCHEMAS[2]
        untrusted = registry.RegistrySettings(url, ca_location=str(pki.other_ca), timeout_s=2.0)
        with pytest.raises(RegistryError, match="TLS .* failed .*certificate") as info:
            registry.RegistryClient(untrusted, sleep=lambda s: None).schema_text(1)
        assert not info.value.retriable  # an untrusted certificate does not heal by retrying
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


@settings(max_examples=300)
@given(st.binary(max_size=300), st.sampled_from([7, 8, 9, 255]))
def test_random_bodies_behind_a_confluent_header_raise_only_record_decode_error(body: bytes, schema_id: int) -> None:
    before = codec.schema_ids()
    ids = registry.SchemaIds(None)
    ids.remember(7, SCHEMAS[2])
    ids.remember(8, SCHEMAS[1])
    ids.remember(9, REPAIR_SCHEMAS[CURRENT_REPAIR_VERSION])
    codec.set_schema_ids(ids)
    try:
        for decode in (decode_log_datum, decode_record, decode_turn):
            try:
                decode(confluent_header(schema_id) + body)
            except RecordDecodeError:
                pass
    finally:
        codec.set_schema_ids(before)


def test_a_schema_already_registered_costs_one_call_per_subject(server: str) -> None:
    base = "/apis/ccompat/v7"
    repair_subject = registry.repair_subject("t")
    _Handler.answers[("POST", f"{base}/subjects/t-value")] = (200, {"id": 21, "version": 2})
    _Handler.answers[("POST", f"{base}/subjects/{repair_subject}")] = (200, {"id": 22, "version": 1})
    before = codec.schema_ids()
    try:
        headers = registry.register_writer_schemas(registry.RegistrySettings(server, timeout_s=2.0), "t")
    finally:
        codec.set_schema_ids(before)
    assert (headers.turn_id, headers.repair_id) == (21, 22)
    assert [p for _, p, _ in _Handler.seen] == [
        f"{base}/subjects/t-value",
        f"{base}/subjects/{repair_subject}",
    ]
