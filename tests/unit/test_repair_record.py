"""Source repair records: building and checking them, golden bytes, and how the codec tells them from turns."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_codec import GOLDEN_V1, GOLDEN_V2

from throughline.core.exceptions import InvalidProjectError, InvalidRepairError
from throughline.core.identity import source_sha256
from throughline.core.repair import (
    MAX_REASON_BYTES,
    NOT_BROKEN,
    REPAIRED,
    UNKNOWN_SOURCE,
    RepairOutcome,
    RepairRecord,
    build_repair,
    decide_repair,
    parse_source_hash,
    repair_problem,
    verify_repair,
)
from throughline.core.turn import ProducerStamp, TurnRecord
from throughline.schemas.codec import (
    CURRENT_REPAIR_VERSION,
    HEADER_BYTES,
    MAGIC,
    REPAIR,
    REPAIR_SCHEMAS,
    SCHEMAS,
    decode_log_datum,
    decode_record,
    decode_repair,
    decode_turn,
    decode_turn_datum,
    encode_datum,
    encode_repair,
    produced_at,
    repair_to_avro,
    writer_schema,
)
from throughline.schemas.exceptions import RecordDecodeError, UnknownSchemaError

PROJECT = "/work/ŝample"
PROJECT_HASH = hashlib.sha256(PROJECT.encode("utf-8")).digest()
SOURCE_HASH = source_sha256(PROJECT_HASH, "h1", "t1")
DATUM_V1: dict[str, Any] = {
    "projectSha256": PROJECT_HASH,
    "sourceSha256": SOURCE_HASH,
    "reason": "gap after seq 3 accepted: seq 4 is lost",
    "producer": {"name": "golden", "version": "1", "producedAt": 1_767_225_601_000_000, "attributes": {"k": "v"}},
}

# CRC-64-AVRO of source_repair.v1.avsc's parsing canonical form. It changes only if the schema file
# changes, and then every repair already in the log would become unreadable: never update it to pass.
FINGERPRINT_V1 = "c91f40833ae1babb"
GOLDEN_V1_REPAIR = (
    "c301c91f40833ae1babb2627a21d0aedf972e43d4f24819c2b12045395c062d3d05453b3db120a8889b776c886b9c43bf6"
    "95451d31a3eef599a91724d1daaa3ed960593b866afdddd05d4e6761702061667465722073657120332061636365707465"
    "643a207365712034206973206c6f73740c676f6c64656e02318089fce288d2a30602026b027600"
)


# -------------------------------------------------------------------------------------------- codec


def test_the_repair_fingerprint_is_pinned_and_distinct_from_the_turns() -> None:
    assert REPAIR_SCHEMAS[1].fingerprint.hex() == FINGERPRINT_V1
    assert CURRENT_REPAIR_VERSION == 1
    assert FINGERPRINT_V1 not in {s.fingerprint.hex() for s in SCHEMAS.values()}


def test_golden_bytes_of_repair_v1() -> None:
    data = encode_datum(DATUM_V1, 1, REPAIR)
    assert data.hex() == GOLDEN_V1_REPAIR
    assert data[:2] == MAGIC and data[2:HEADER_BYTES].hex() == FINGERPRINT_V1
    schema = writer_schema(data)
    assert (schema.family, schema.version) == (REPAIR, 1)


def test_the_golden_repair_decodes_and_encodes_back() -> None:
    record = decode_repair(bytes.fromhex(GOLDEN_V1_REPAIR))
    assert record == RepairRecord(
        project_sha256=PROJECT_HASH,
        source_sha256=SOURCE_HASH,
        reason="gap after seq 3 accepted: seq 4 is lost",
        producer=ProducerStamp("golden", "1", 1_767_225_601_000_000, {"k": "v"}),
    )
    assert encode_repair(record).hex() == GOLDEN_V1_REPAIR
    assert repair_to_avro(record) == DATUM_V1


def test_the_log_decoders_tell_a_repair_from_a_turn() -> None:
    repair = bytes.fromhex(GOLDEN_V1_REPAIR)
    assert isinstance(decode_log_datum(repair), RepairRecord)
    assert isinstance(decode_record(repair), RepairRecord)
    for golden in (GOLDEN_V1, GOLDEN_V2):  # every turn version stays readable through the new entry points
        turn = bytes.fromhex(golden)
        assert decode_log_datum(turn) == decode_turn_datum(turn)
        assert decode_record(turn) == decode_turn(turn)
        assert isinstance(decode_record(turn), TurnRecord)


def test_turn_only_readers_refuse_a_repair_as_unknown_schema() -> None:
    # What a projector without repair support does with one: quarantine it, code unknown_schema.
    with pytest.raises(UnknownSchemaError, match="source_repair record"):
        decode_turn_datum(bytes.fromhex(GOLDEN_V1_REPAIR))
    with pytest.raises(UnknownSchemaError, match="not a source_repair"):
        decode_repair(bytes.fromhex(GOLDEN_V2))


def test_an_unknown_fingerprint_stays_unknown_schema_for_every_decoder() -> None:
    data = bytearray.fromhex(GOLDEN_V1_REPAIR)
    data[2:HEADER_BYTES] = bytes(8)
    for decode in (decode_repair, decode_record, decode_log_datum, decode_turn_datum):
        with pytest.raises(UnknownSchemaError) as info:
            decode(bytes(data))
        assert info.value.code == "unknown_schema"


def test_every_truncation_of_a_repair_is_a_record_decode_error() -> None:
    data = bytes.fromhex(GOLDEN_V1_REPAIR)
    for cut in range(len(data)):
        with pytest.raises(RecordDecodeError):
            decode_record(data[:cut])
    with pytest.raises(RecordDecodeError, match="trailing"):
        decode_record(data + b"\x00")


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_random_bodies_behind_the_repair_header_raise_only_record_decode_error(body: bytes) -> None:
    data = MAGIC + bytes.fromhex(FINGERPRINT_V1) + body
    try:
        record = decode_log_datum(data)
    except RecordDecodeError:
        return
    assert isinstance(record, RepairRecord)


_text = st.text(st.characters(codec="utf-8"), max_size=40)


@settings(max_examples=200)
@given(
    st.builds(
        RepairRecord,
        st.binary(min_size=32, max_size=32),
        st.binary(min_size=32, max_size=32),
        _text,
        st.builds(
            ProducerStamp,
            _text,
            _text,
            st.integers(-(1 << 63), (1 << 63) - 1),
            st.dictionaries(_text, _text, max_size=3),
        ),
    )
)
def test_any_repair_roundtrips(record: RepairRecord) -> None:
    data = encode_repair(record)
    stamp = dataclasses.replace(record.producer, attributes=dict(record.producer.attributes))
    assert decode_repair(data) == dataclasses.replace(record, producer=stamp)
    assert produced_at(data) == record.producer.produced_at_micros


def test_produced_at_of_turns_repairs_and_garbage() -> None:
    assert produced_at(bytes.fromhex(GOLDEN_V2)) == decode_turn(bytes.fromhex(GOLDEN_V2)).producer.produced_at_micros
    assert produced_at(bytes.fromhex(GOLDEN_V1_REPAIR)) == 1_767_225_601_000_000
    assert produced_at(b"garbage") is None
    assert produced_at(None) is None


def test_encode_repair_refuses_fields_that_do_not_fit() -> None:
    record = decode_repair(bytes.fromhex(GOLDEN_V1_REPAIR))
    with pytest.raises(ValueError):
        encode_repair(dataclasses.replace(record, source_sha256=b"short"))
    with pytest.raises((TypeError, ValueError)):
        encode_repair(dataclasses.replace(record, reason=b"bytes"))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------- the record


def test_build_repair_hashes_the_names_and_keeps_none_of_them() -> None:
    by_names = build_repair(project="/work/ŝample/", host="h1", thread="t1", reason="accepted")
    assert by_names.project_sha256 == PROJECT_HASH  # the canonical project (no trailing slash)
    assert by_names.source_sha256 == SOURCE_HASH
    by_hash = build_repair(project=PROJECT, source=parse_source_hash(SOURCE_HASH.hex()), reason="accepted")
    assert by_hash == by_names
    fields = {f.name for f in dataclasses.fields(RepairRecord)}
    assert not fields & {"project", "host", "thread"}


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"host": "h1"}, "invalid_arguments"),
        ({"thread": "t1"}, "invalid_arguments"),
        ({}, "invalid_arguments"),
        ({"host": "h1", "thread": "t1", "source": SOURCE_HASH}, "invalid_arguments"),
        ({"host": "", "thread": "t1"}, "invalid_source"),
        ({"host": "h\x00", "thread": "t1"}, "invalid_source"),
        ({"source": b"short"}, "invalid_source"),
        ({"host": "h1", "thread": "t1", "reason": "  "}, "invalid_reason"),
        ({"host": "h1", "thread": "t1", "reason": "x" * (MAX_REASON_BYTES + 1)}, "invalid_reason"),
        ({"host": "h1", "thread": "t1", "reason": "a\x00b"}, "invalid_reason"),
    ],
)
def test_build_repair_refuses_what_a_record_cannot_carry(kwargs: dict[str, Any], code: str) -> None:
    with pytest.raises(InvalidRepairError) as info:
        build_repair(project=PROJECT, **{"reason": "why", **kwargs})
    assert info.value.code == code and info.value.exit_code == 2


def test_build_repair_refuses_a_bad_project() -> None:
    with pytest.raises(InvalidProjectError):
        build_repair(project="", host="h1", thread="t1", reason="why")


@pytest.mark.parametrize("text", ["", "ab", "zz" * 32, SOURCE_HASH.hex() + "0", 7])
def test_parse_source_hash_refuses_what_is_not_64_hex(text: object) -> None:
    with pytest.raises(InvalidRepairError) as info:
        parse_source_hash(text)
    assert info.value.code == "invalid_source"
    assert parse_source_hash(SOURCE_HASH.hex().upper()) == SOURCE_HASH


def test_repair_problem_checks_the_record_and_its_partition_key() -> None:
    record = decode_repair(bytes.fromhex(GOLDEN_V1_REPAIR))
    assert verify_repair(record) is None
    assert repair_problem(record, PROJECT_HASH) is None and repair_problem(record, None) is None
    assert repair_problem(record, bytes(32)) == "record's project does not match its partition key"
    assert repair_problem(dataclasses.replace(record, reason=""), PROJECT_HASH)
    assert repair_problem(dataclasses.replace(record, reason="\ud800"), PROJECT_HASH) == (
        "the repair reason is not valid Unicode text"
    )


def test_decide_repair() -> None:
    assert decide_repair(known=True, broken=True, unrepaired=2) == RepairOutcome(REPAIRED, True, 2)
    # Quarantined records that never broke the source (refused before the fold) are marked too.
    assert decide_repair(known=True, broken=False, unrepaired=1) == RepairOutcome(REPAIRED, False, 1)
    assert decide_repair(known=True, broken=False, unrepaired=0) == RepairOutcome(NOT_BROKEN, False, 0)
    assert decide_repair(known=False, broken=False, unrepaired=0) == RepairOutcome(UNKNOWN_SOURCE, False, 0)
