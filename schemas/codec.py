"""Avro encoding of the log's records, with the writer schema named in every record.

Wire format: Avro single-object encoding (Avro spec, "Single object encoding")::

    0xC3 0x01 || CRC-64-AVRO fingerprint of the writer schema's parsing canonical form (8 bytes,
    little-endian) || Avro binary body

or, written with a schema registry (``--schema-registry``), the Confluent wire format::

    0x00 || the registry's schema id (4 bytes, big-endian) || Avro binary body

Every decoder accepts both, told apart by the first byte. A schema id is resolved through the
process's ``SchemaIds`` (``throughline.schemas.registry.install``; cached per id), then the body
decodes exactly as a single-object record of that schema. Without a registry, or for an id that
names no schema this reader knows, the record raises ``UnknownSchemaIdError`` (an ``UnknownSchemaError``).

Two families of records share the topic, told apart by the fingerprint alone: completed turns
(``completed_turn.vN.avsc``) and source repairs (``source_repair.vN.avsc``, ``throughline repair``).
The schemas live beside this module and are parsed once at import. A record is always written with
its family's newest version; a record written with any known older version is read through Avro
schema resolution into the newest shape. A record whose fingerprint is unknown raises
``UnknownSchemaError``; ``decode_turn``/``decode_turn_datum`` raise it for a repair record too (they
read turns only), ``decode_record``/``decode_log_datum`` return either family.
"""

from __future__ import annotations

import copy
import io
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

from throughline.core.encoding import read_zigzag
from throughline.core.repair import RepairRecord
from throughline.core.turn import ProducerStamp, TurnRecord
from throughline.errors import ThroughlineError
from throughline.schemas.exceptions import RecordDecodeError, UnknownSchemaError, UnknownSchemaIdError

MAGIC = b"\xc3\x01"
HEADER_BYTES = 10
#: The Confluent wire format's first byte and header length (magic byte, 4-byte schema id).
CONFLUENT_MAGIC = 0
CONFLUENT_HEADER_BYTES = 5
TURN = "completed_turn"
REPAIR = "source_repair"
SCHEMA_VERSIONS = (1, 2)
CURRENT_VERSION = SCHEMA_VERSIONS[-1]
REPAIR_SCHEMA_VERSIONS = (1,)
CURRENT_REPAIR_VERSION = REPAIR_SCHEMA_VERSIONS[-1]


def without_logical_types(node: Any) -> Any:
    """A schema (or any part of one) without its ``logicalType`` annotations: what throughline reads with.

    Timestamps stay integer microseconds inside throughline (exact, and cheaper than datetimes); logical
    types do not change the binary encoding, so stripping them keeps the bytes identical. The benchmark's
    Quix Streams peer is handed the schema stripped by this function, so both read the same shape.
    """
    if isinstance(node, dict):
        return {k: without_logical_types(v) for k, v in node.items() if k != "logicalType"}
    if isinstance(node, list):
        return [without_logical_types(v) for v in node]
    return node


@dataclass(frozen=True)
class SchemaVersion:
    """One known writer schema."""

    version: int
    source: dict[str, Any]
    parsed: Any
    fingerprint: bytes
    family: str = TURN


def _load(version: int, family: str = TURN) -> SchemaVersion:
    text = resources.files("throughline.schemas").joinpath(f"{family}.v{version}.avsc").read_text("utf-8")
    source = json.loads(text)
    canonical = to_parsing_canonical_form(fastavro.parse_schema(copy.deepcopy(source)))
    parsed = fastavro.parse_schema(without_logical_types(source))
    return SchemaVersion(version, source, parsed, bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")), family)


SCHEMAS: dict[int, SchemaVersion] = {v: _load(v) for v in SCHEMA_VERSIONS}
REPAIR_SCHEMAS: dict[int, SchemaVersion] = {v: _load(v, REPAIR) for v in REPAIR_SCHEMA_VERSIONS}
_BY_FINGERPRINT: dict[bytes, SchemaVersion] = {s.fingerprint: s for s in SCHEMAS.values()}
_REPAIR_BY_FINGERPRINT: dict[bytes, SchemaVersion] = {s.fingerprint: s for s in REPAIR_SCHEMAS.values()}
assert not set(_BY_FINGERPRINT) & set(_REPAIR_BY_FINGERPRINT), "two schemas share a fingerprint"
_CURRENT = SCHEMAS[CURRENT_VERSION]
_CURRENT_HEADER = MAGIC + _CURRENT.fingerprint
_CURRENT_REPAIR = REPAIR_SCHEMAS[CURRENT_REPAIR_VERSION]


class SchemaIdResolver(Protocol):
    """What a registry-framed record's schema id is looked up with (``registry.SchemaIds``)."""

    def resolve(self, schema_id: int) -> SchemaVersion: ...


_schema_ids: SchemaIdResolver | None = None


def set_schema_ids(resolver: SchemaIdResolver | None) -> None:
    """Install the resolver of schema ids for this process (``registry.install`` calls it)."""
    global _schema_ids
    _schema_ids = resolver


def schema_ids() -> SchemaIdResolver | None:
    """The installed resolver of schema ids (``None``: no registry)."""
    return _schema_ids


def schema_by_fingerprint(head: bytes) -> SchemaVersion | None:
    """The known schema (either family) with this 8-byte CRC-64-AVRO fingerprint, or ``None``."""
    return _BY_FINGERPRINT.get(head) or _REPAIR_BY_FINGERPRINT.get(head)


def confluent_header(schema_id: int) -> bytes:
    """The 5-byte Confluent header of a record written with the registry's ``schema_id``."""
    if not 0 <= schema_id < 1 << 32:
        raise ValueError(f"schema id {schema_id} does not fit 4 bytes")
    return bytes([CONFLUENT_MAGIC]) + schema_id.to_bytes(4, "big")


def _producer_datum(producer: ProducerStamp) -> dict[str, Any]:
    """The ``producer`` sub-record both families share."""
    return {
        "name": producer.name,
        "version": producer.version,
        "producedAt": producer.produced_at_micros,
        "attributes": dict(producer.attributes),
    }


def _producer_stamp(producer: dict[str, Any]) -> ProducerStamp:
    """A decoded ``producer`` sub-record (the inverse of ``_producer_datum``; v1 turns have no attributes)."""
    return ProducerStamp(producer["name"], producer["version"], producer["producedAt"], producer.get("attributes", {}))


def turn_to_avro(record: TurnRecord) -> dict[str, Any]:
    """The Avro datum (current schema) of a turn record."""
    return {
        "project": record.project,
        "projectSha256": record.project_sha256,
        "host": record.host,
        "thread": record.thread,
        "turnId": record.turn_id,
        "seq": record.seq,
        "completedAt": record.completed_at_micros,
        "body": record.body,
        "contentDigest": record.content_digest,
        "producer": _producer_datum(record.producer),
    }


def encode_turn(record: TurnRecord, header: bytes = _CURRENT_HEADER) -> bytes:
    """Encode a turn record with the current schema, single-object framed (or behind ``header``: the
    ``confluent_header`` of the current schema's registry id).

    Written by hand for the one fixed schema (the producer's hot path: fastavro's generic writer and
    the datum dict cost ~3x as much); ``tests/unit/test_codec.py`` proves the bytes equal fastavro's
    for the golden record and for generated turns. Raises ``TypeError``/``ValueError``/``OverflowError``
    for a field that does not fit the schema, as fastavro would.
    """
    seq = record.seq
    producer = record.producer
    attributes = producer.attributes
    body = record.body
    if type(body) is not str:
        raise TypeError(f"expected a str for an Avro string, got {type(body).__name__}")
    text = body.encode("utf-8")
    # The body goes into the final join on its own: prefixing it with its length first would copy it
    # once more (the record's largest field).
    parts = [
        header,
        _string(record.project),
        _fixed32(record.project_sha256),
        _string(record.host),
        _string(record.thread),
        _string(record.turn_id),
        b"\x00" if seq is None else b"\x02" + _long(seq),
        _long(record.completed_at_micros),
        _long(len(text)),
        text,
        _fixed32(record.content_digest),
        _string(producer.name),
        _string(producer.version),
        _long(producer.produced_at_micros),
    ]
    if attributes:
        # One block of entries, then the empty block that ends the map (fastavro's layout).
        parts.append(_long(len(attributes)))
        for key, value in attributes.items():
            parts.append(_string(key))
            parts.append(_string(value))
    parts.append(b"\x00")
    return b"".join(parts)


_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
#: Zig-zag varints of 0..1023: string lengths and small counts, the encoder's most common longs.
_SMALL_LONGS = tuple(bytes([2 * n]) if n < 64 else bytes([(2 * n & 0x7F) | 0x80, 2 * n >> 7]) for n in range(1024))


def _long(n: int) -> bytes:
    """Avro's zig-zag varint of a long."""
    if type(n) is not int:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"expected an int for an Avro long, got {type(n).__name__}")
        n = int(n)
    if 0 <= n < 1024:
        return _SMALL_LONGS[n]
    if not _LONG_MIN <= n <= _LONG_MAX:
        raise OverflowError(f"{n} does not fit an Avro long")
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _string(s: str) -> bytes:
    if type(s) is not str:
        raise TypeError(f"expected a str for an Avro string, got {type(s).__name__}")
    data = s.encode("utf-8")
    n = len(data)
    return (_SMALL_LONGS[n] if n < 1024 else _long(n)) + data


def _fixed32(b: bytes) -> bytes:
    if type(b) is bytes and len(b) == 32:
        return b  # the usual case, without the isinstance of a union and a copy
    if not isinstance(b, bytes | bytearray | memoryview) or len(b) != 32:
        raise ValueError("expected 32 bytes for a Sha256 fixed")
    return bytes(b)


def encode_datum(datum: dict[str, Any], version: int, family: str = TURN, schema_id: int | None = None) -> bytes:
    """Encode a raw datum with an explicit schema version of ``family`` (golden-bytes and evolution
    tests); Confluent-framed with ``schema_id``."""
    schema = (REPAIR_SCHEMAS if family == REPAIR else SCHEMAS)[version]
    buf = io.BytesIO()
    buf.write(MAGIC + schema.fingerprint if schema_id is None else confluent_header(schema_id))
    fastavro.schemaless_writer(buf, schema.parsed, datum)
    return buf.getvalue()


def writer_version(data: bytes) -> int:
    """The turn schema version a record was written with; raises for a bad header, an unknown
    fingerprint or a repair record."""
    schema = writer_schema(data)
    if schema.family != TURN:
        raise UnknownSchemaError(f"a {schema.family} record (schema v{schema.version}), not a turn")
    return schema.version


def writer_schema(data: bytes) -> SchemaVersion:
    """The schema (of either family) a record was written with; raises for a bad header, an unknown
    fingerprint or schema id (``UnknownSchemaError``), or a registry that is away (``RegistryUnavailableError``)."""
    return _writer(data)[0]


def _writer(data: bytes) -> tuple[SchemaVersion, int]:
    """The writer schema and where the Avro body starts, for either framing."""
    if len(data) >= CONFLUENT_HEADER_BYTES and data[0] == CONFLUENT_MAGIC:
        schema_id = int.from_bytes(data[1:CONFLUENT_HEADER_BYTES], "big")
        resolver = _schema_ids
        if resolver is None:
            raise UnknownSchemaIdError(
                f"registry-framed record (schema id {schema_id}) but no schema registry is configured"
            )
        return resolver.resolve(schema_id), CONFLUENT_HEADER_BYTES
    if len(data) < HEADER_BYTES or data[:2] != MAGIC:
        raise RecordDecodeError("not an Avro single-object or registry-framed record (bad magic or too short)")
    head = bytes(data[2:HEADER_BYTES])
    schema = _BY_FINGERPRINT.get(head) or _REPAIR_BY_FINGERPRINT.get(head)
    if schema is None:
        raise UnknownSchemaError(f"unknown writer schema fingerprint {head.hex()}")
    return schema, HEADER_BYTES


def decode_turn(data: bytes) -> TurnRecord:
    """Decode one topic record into a ``TurnRecord`` (current shape, whatever version wrote it).

    Raises ``UnknownSchemaError`` or ``RecordDecodeError``; never anything else for bad bytes.
    """
    datum = decode_turn_datum(data)
    return TurnRecord(
        project=datum["project"],
        project_sha256=datum["projectSha256"],
        host=datum["host"],
        thread=datum["thread"],
        turn_id=datum["turnId"],
        seq=datum["seq"],
        completed_at_micros=datum["completedAt"],
        body=datum["body"],
        content_digest=datum["contentDigest"],
        producer=_producer_stamp(datum["producer"]),
    )


def decode_turn_datum(data: bytes) -> dict[str, Any]:
    """Decode one topic record into the current schema's datum (a dict, as fastavro returns it).

    What ``decode_turn`` builds its ``TurnRecord`` from; the projector reads the datum directly, which
    saves building two frozen dataclasses (the record and its producer stamp) per record. Same errors
    as ``decode_turn``.
    """
    schema, start = _writer(data)
    if schema.family != TURN:
        raise UnknownSchemaError(f"a {schema.family} record (schema v{schema.version}), not a turn")
    if schema is _CURRENT:
        return _current_datum(data, start)
    return _resolve(data, schema, _CURRENT, start)


def _current_datum(data: bytes, start: int = HEADER_BYTES) -> dict[str, Any]:
    """``_read_current`` with its errors as ``RecordDecodeError`` (the header is already checked)."""
    try:
        return _read_current(data, start)
    except (IndexError, ValueError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
        raise RecordDecodeError(f"Avro body does not decode: {type(exc).__name__}: {exc}") from None


def _resolve(data: bytes, writer: SchemaVersion, reader: SchemaVersion, start: int = HEADER_BYTES) -> dict[str, Any]:
    """The body of ``data`` (written with ``writer``, from ``start``) read by fastavro into ``reader``'s shape."""
    buf = io.BytesIO(data)
    buf.seek(start)
    try:
        datum = fastavro.schemaless_reader(buf, writer.parsed, reader.parsed)
    except Exception as exc:  # fastavro raises many types (EOFError, UnicodeDecodeError, ...)
        raise RecordDecodeError(f"Avro body does not decode: {type(exc).__name__}: {exc}") from None
    if buf.tell() != len(data):
        raise RecordDecodeError(f"{len(data) - buf.tell()} trailing bytes after the Avro body")
    if not isinstance(datum, dict):
        raise RecordDecodeError("Avro body is not a record")
    return datum


# ------------------------------------------------------------------------------------------- repairs


def repair_to_avro(record: RepairRecord) -> dict[str, Any]:
    """The Avro datum (current repair schema) of a repair record."""
    return {
        "projectSha256": record.project_sha256,
        "sourceSha256": record.source_sha256,
        "reason": record.reason,
        "producer": _producer_datum(record.producer),
    }


def encode_repair(record: RepairRecord, header: bytes | None = None) -> bytes:
    """Encode a repair record with the current repair schema, single-object framed (or behind
    ``header``: the ``confluent_header`` of the current repair schema's registry id).

    fastavro's generic writer: repairs are rare, so no hand-written encoder. Raises
    ``TypeError``/``ValueError``/``OverflowError`` for a field that does not fit the schema.
    """
    buf = io.BytesIO()
    buf.write(MAGIC + _CURRENT_REPAIR.fingerprint if header is None else header)
    fastavro.schemaless_writer(buf, _CURRENT_REPAIR.parsed, repair_to_avro(record))
    return buf.getvalue()


def _repair_of(datum: dict[str, Any]) -> RepairRecord:
    try:
        return RepairRecord(
            project_sha256=datum["projectSha256"],
            source_sha256=datum["sourceSha256"],
            reason=datum["reason"],
            producer=_producer_stamp(datum["producer"]),
        )
    except (KeyError, TypeError) as exc:
        raise RecordDecodeError(f"Avro body is not a repair record: {type(exc).__name__}: {exc}") from None


def decode_repair(data: bytes) -> RepairRecord:
    """Decode one topic record written with a repair schema (any known version) into a ``RepairRecord``.

    Raises ``UnknownSchemaError`` (a turn, or an unknown fingerprint) or ``RecordDecodeError``.
    """
    schema, start = _writer(data)
    if schema.family != REPAIR:
        raise UnknownSchemaError(f"a {schema.family} record (schema v{schema.version}), not a {REPAIR}")
    return _repair_of(_resolve(data, schema, _CURRENT_REPAIR, start))


def decode_log_datum(data: bytes) -> dict[str, Any] | RepairRecord:
    """Decode any record of the log: a turn's datum (as ``decode_turn_datum``) or a ``RepairRecord``.

    The projector's decode path (``projector/prepare.py``) tells the two apart by type: a ``dict`` is
    a turn, a ``RepairRecord`` a repair. Same errors as ``decode_turn_datum``.
    """
    if data[:HEADER_BYTES] == _CURRENT_HEADER:
        return _current_datum(data)  # the usual case, without a second fingerprint lookup
    schema, start = _writer(data)
    if schema.family == REPAIR:
        return _repair_of(_resolve(data, schema, _CURRENT_REPAIR, start))
    if schema is _CURRENT:
        return _current_datum(data, start)  # a registry-framed current turn: the same fast reader
    return _resolve(data, schema, _CURRENT, start)


def decode_record(data: bytes) -> TurnRecord | RepairRecord:
    """Decode any record of the log into its value type (``decode_turn`` or ``decode_repair``)."""
    if writer_schema(data).family == REPAIR:
        return decode_repair(data)
    return decode_turn(data)


def produced_at(data: bytes | None) -> int | None:
    """When a record's producer wrote it (``producer.producedAt``, µs), or ``None`` when it does not decode.

    What ``throughline quarantine`` shows as a quarantined record's time: the projection keeps no
    wall-clock time of its own (a replay must reproduce it exactly).
    """
    if data is None:
        return None
    try:
        record = decode_record(data)
    except ThroughlineError:  # undecodable, or its schema id cannot be looked up now
        return None
    return record.producer.produced_at_micros


def _read_string(data: bytes, p: int) -> tuple[str, int]:
    # A slice past the end is cut short rather than refused: the caller's final position check
    # refuses the record then (the position runs past the end); only a negative size must stop here.
    b = data[p]
    if b < 0x80:
        end = p + 1 + (b >> 1)
        if b & 1:
            raise ValueError(f"a string of negative size at byte {p}")
        return data[p + 1 : end].decode("utf-8"), end
    size, p = read_zigzag(data, p)
    if size < 0:
        raise ValueError(f"a string of negative size at byte {p}")
    end = p + size
    return data[p:end].decode("utf-8"), end


def _read_current(data: bytes, p: int = HEADER_BYTES) -> dict[str, Any]:
    """The current schema's body, read by hand in its fixed field order.

    The projector decodes every record it reads, and fastavro's generic reader (with the buffer
    object it needs) costs ~1.2x this. The short strings (names, ids: under 64 bytes, one length byte)
    are read inline, not through ``_read_string``: a call a field was ~10% of the read. An empty
    attribute map is one zero byte. ``tests/unit/test_codec.py`` proves it returns fastavro's datum
    for generated turns and refuses what fastavro refuses among damaged ones.
    """
    b = data[p]
    if b < 0x80 and not b & 1:
        end = p + 1 + (b >> 1)
        project = data[p + 1 : end].decode("utf-8")
        p = end
    else:
        project, p = _read_string(data, p)
    project_hash = data[p : p + 32]
    p += 32
    b = data[p]
    if b < 0x80 and not b & 1:
        end = p + 1 + (b >> 1)
        host = data[p + 1 : end].decode("utf-8")
        p = end
    else:
        host, p = _read_string(data, p)
    b = data[p]
    if b < 0x80 and not b & 1:
        end = p + 1 + (b >> 1)
        thread = data[p + 1 : end].decode("utf-8")
        p = end
    else:
        thread, p = _read_string(data, p)
    b = data[p]
    if b < 0x80 and not b & 1:
        end = p + 1 + (b >> 1)
        turn_id = data[p + 1 : end].decode("utf-8")
        p = end
    else:
        turn_id, p = _read_string(data, p)
    seq: int | None
    b = data[p]
    if b == 0:  # union branch 0: null
        seq = None
        p += 1
    elif b == 2:  # union branch 1: long
        seq, p = read_zigzag(data, p + 1)
    else:  # a branch index in more than one byte (not canonical, but Avro), or no branch at all
        branch, p = read_zigzag(data, p)
        if branch == 1:
            seq, p = read_zigzag(data, p)
        elif branch == 0:
            seq = None
        else:
            raise ValueError(f"union branch {branch} of seq does not exist")
    completed_at, p = read_zigzag(data, p)
    body, p = _read_string(data, p)
    content_digest = data[p : p + 32]
    p += 32
    b = data[p]
    if b < 0x80 and not b & 1:
        end = p + 1 + (b >> 1)
        name = data[p + 1 : end].decode("utf-8")
        p = end
    else:
        name, p = _read_string(data, p)
    b = data[p]
    if b < 0x80 and not b & 1:
        end = p + 1 + (b >> 1)
        version = data[p + 1 : end].decode("utf-8")
        p = end
    else:
        version, p = _read_string(data, p)
    produced_at, p = read_zigzag(data, p)
    attributes: dict[str, str] = {}
    if data[p] == 0:
        p += 1
    else:
        count, p = read_zigzag(data, p)
        while count:
            if count < 0:  # a block that also states its size in bytes
                count = -count
                _, p = read_zigzag(data, p)
            for _ in range(count):
                key, p = _read_string(data, p)
                attributes[key], p = _read_string(data, p)
            count, p = read_zigzag(data, p)
    if p != len(data):  # past the end: a field was cut short
        raise RecordDecodeError(
            f"{len(data) - p} trailing bytes after the Avro body" if p < len(data) else "the body ends inside a field"
        )
    return {
        "project": project,
        "projectSha256": project_hash,
        "host": host,
        "thread": thread,
        "turnId": turn_id,
        "seq": seq,
        "completedAt": completed_at,
        "body": body,
        "contentDigest": content_digest,
        "producer": {"name": name, "version": version, "producedAt": produced_at, "attributes": attributes},
    }
