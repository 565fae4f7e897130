"""A schema registry client (Confluent's REST API, which Apicurio Registry also serves) and the
Confluent wire format's schema ids.

Kafka's ecosystem (Connect sinks, stream processors, topic browsers) reads Avro framed as::

    0x00 || schema id (4 bytes, big-endian) || Avro binary body

where the id is the registry's. With ``--schema-registry`` producers register their writer schemas
(``register_writer_schemas``) and write that framing; every reader accepts both framings, told apart
by the first byte (``schemas/codec.py``). A schema id is resolved once per process through the
registry (``SchemaIds``, bounded cache), then the record decodes with the same decoder as a
single-object record of that schema: the registry's answer is mapped onto a schema throughline knows
by its parsing canonical form's fingerprint, so a registry may only name schemas throughline ships.

The client is the standard library's ``urllib`` (no new dependency): every request is bounded by a
timeout, retried a bounded number of times while the registry is away (``RegistryUnavailableError``,
retriable), and an error answer becomes a typed error. Credentials never appear in a message.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

from throughline.schemas import codec
from throughline.schemas.codec import REPAIR, SchemaVersion
from throughline.schemas.exceptions import (
    RegistryError,
    RegistryUnavailableError,
    SchemaIncompatibleError,
    UnknownSchemaIdError,
)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
#: The compatibility level a new subject is given (a reader of the new schema reads every older record).
COMPATIBILITY = "BACKWARD"
#: Schema ids remembered per process (a topic's writers use a handful; unknown ids are remembered too,
#: so a topic full of foreign records asks the registry once per id, not once per record).
MAX_CACHED_IDS = 1024
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_ATTEMPTS = 3
_BACKOFF_S = (0.2, 0.5, 1.0)


@dataclass(frozen=True, slots=True)
class RegistrySettings:
    """Where the registry is and how to reach it (``schema.registry.*`` in the client properties file,
    or ``--schema-registry URL``). ``user_info`` is ``user:password`` (HTTP basic auth); it and the key's
    pass phrase are kept out of ``repr``."""

    url: str
    user_info: str | None = field(default=None, repr=False)
    ca_location: str | None = None
    certificate_location: str | None = None
    key_location: str | None = None
    key_password: str | None = field(default=None, repr=False)
    check_hostname: bool = True
    timeout_s: float = DEFAULT_TIMEOUT_S

    def secrets(self) -> tuple[str, ...]:
        """The secret values, so that error texts can be scrubbed of them."""
        password = self.user_info.partition(":")[2] if self.user_info else None
        return tuple(s for s in (self.user_info, password, self.key_password) if s)


def _ssl_context(settings: RegistrySettings) -> ssl.SSLContext | None:
    if not settings.url.lower().startswith("https://"):
        return None
    context = ssl.create_default_context(cafile=settings.ca_location)
    if not settings.check_hostname:
        context.check_hostname = False
    if settings.certificate_location:
        context.load_cert_chain(settings.certificate_location, settings.key_location, settings.key_password)
    return context


class RegistryClient:
    """The few calls of Confluent's Schema Registry REST API throughline needs (stdlib HTTP)."""

    def __init__(
        self,
        settings: RegistrySettings,
        *,
        attempts: int = DEFAULT_ATTEMPTS,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self._base = settings.url.rstrip("/")
        self._attempts = max(1, attempts)
        self._sleep = sleep
        self._context = _ssl_context(settings)
        self._auth = None
        if settings.user_info:
            self._auth = "Basic " + base64.b64encode(settings.user_info.encode("utf-8")).decode("ascii")

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        """(status, decoded JSON) of one call; 5xx and no answer are retried, then ``RegistryUnavailableError``."""
        data = None if body is None else json.dumps(body).encode("utf-8")
        headers = {"Accept": CONTENT_TYPE + ", application/json"}
        if data is not None:
            headers["Content-Type"] = CONTENT_TYPE
        if self._auth:
            headers["Authorization"] = self._auth
        last = ""
        for attempt in range(self._attempts):
            if attempt:
                self._sleep(_BACKOFF_S[min(attempt - 1, len(_BACKOFF_S) - 1)])
            request = urllib.request.Request(self._base + path, data=data, headers=headers, method=method)
            try:
                with urllib.request.urlopen(request, timeout=self.settings.timeout_s, context=self._context) as resp:
                    return resp.status, _json(resp.read())
            except urllib.error.HTTPError as exc:
                payload = _json(exc.read(), strict=False)
                if exc.code >= 500:
                    last = f"HTTP {exc.code}"
                    continue
                return exc.code, payload
            except (urllib.error.URLError, OSError, TimeoutError) as exc:
                reason = getattr(exc, "reason", exc)
                if isinstance(reason, ssl.SSLCertVerificationError | ssl.SSLError):
                    # An untrusted or mismatched certificate does not heal by waiting: a settings problem.
                    raise RegistryError(
                        f"TLS with schema registry {self._where()} failed ({type(reason).__name__}: "
                        f"{self._scrub(str(reason))[:300]}); check schema.registry.ssl.*"
                    ) from None
                last = f"{type(reason).__name__}: {reason}"
                continue
        raise RegistryUnavailableError(
            f"schema registry {self._where()} did not answer {method} {path.split('?')[0]} after "
            f"{self._attempts} attempts ({self._scrub(last)})"
        )

    def _where(self) -> str:
        parts = urllib.parse.urlsplit(self._base)
        return f"{parts.scheme}://{parts.hostname}{':' + str(parts.port) if parts.port else ''}{parts.path}"

    def _scrub(self, text: str) -> str:
        for secret in self.settings.secrets():
            text = text.replace(secret, "****")
        return text

    def _refused(self, what: str, status: int, payload: Any) -> RegistryError:
        message = payload.get("message") if isinstance(payload, dict) else None
        detail = f"HTTP {status}" + (f": {self._scrub(str(message))[:300]}" if message else "")
        if status in (401, 403):
            return RegistryError(f"schema registry {self._where()} refused the credentials for {what} ({detail})")
        return RegistryError(f"schema registry {self._where()} refused {what} ({detail})")

    def schema_text(self, schema_id: int) -> str | None:
        """The schema registered under ``schema_id`` (its JSON text), or ``None`` when the registry has no such id."""
        status, payload = self._request("GET", f"/schemas/ids/{int(schema_id)}")
        if status == 404:
            return None
        if status != 200 or not isinstance(payload, dict) or not isinstance(payload.get("schema"), str):
            raise self._refused(f"schema id {schema_id}", status, payload)
        kind = payload.get("schemaType", "AVRO")
        if kind != "AVRO":
            raise UnknownSchemaIdError(f"schema id {schema_id} is a {kind} schema, not Avro")
        text: str = payload["schema"]
        return text

    def register(self, subject: str, schema: str) -> int:
        """Register ``schema`` under ``subject`` (idempotent: a known schema keeps its id) and return its id.

        Raises ``SchemaIncompatibleError`` when the subject's compatibility rule refuses it."""
        status, payload = self._request("POST", f"/subjects/{_quote(subject)}/versions", {"schema": schema})
        if status == 409:
            raise SchemaIncompatibleError(
                f"schema registry refused the schema for subject {subject!r}: {_message(payload)}"
            )
        if status != 200 or not isinstance(payload, dict) or not isinstance(payload.get("id"), int):
            raise self._refused(f"registering a schema under {subject!r}", status, payload)
        schema_id: int = payload["id"]
        return schema_id

    def lookup(self, subject: str, schema: str) -> int | None:
        """The id of ``schema`` when it is already registered under ``subject`` (``None``: it is not)."""
        status, payload = self._request("POST", f"/subjects/{_quote(subject)}", {"schema": schema})
        if status == 404:
            return None
        if status != 200 or not isinstance(payload, dict) or not isinstance(payload.get("id"), int):
            raise self._refused(f"looking up a schema under {subject!r}", status, payload)
        schema_id: int = payload["id"]
        return schema_id

    def is_compatible(self, subject: str, schema: str) -> tuple[bool, str]:
        """Whether ``schema`` passes ``subject``'s compatibility rule against its latest version (and the
        registry's reasons when not); a subject with no version yet accepts any schema."""
        status, payload = self._request(
            "POST",
            f"/compatibility/subjects/{_quote(subject)}/versions/latest?verbose=true",
            {"schema": schema},
        )
        if status == 404:
            return True, ""
        if status != 200 or not isinstance(payload, dict) or not isinstance(payload.get("is_compatible"), bool):
            raise self._refused(f"the compatibility check of {subject!r}", status, payload)
        reasons = payload.get("messages") or []
        return payload["is_compatible"], "; ".join(str(m) for m in reasons)[:500]

    def compatibility(self, subject: str) -> str | None:
        """The compatibility level set on ``subject`` itself (``None``: none set)."""
        status, payload = self._request("GET", f"/config/{_quote(subject)}")
        if status == 404:
            return None
        if status != 200 or not isinstance(payload, dict):
            raise self._refused(f"the compatibility level of {subject!r}", status, payload)
        level = payload.get("compatibilityLevel") or payload.get("compatibility")
        return str(level) if level else None

    def set_compatibility(self, subject: str, level: str = COMPATIBILITY) -> None:
        """Set ``subject``'s compatibility level."""
        status, payload = self._request("PUT", f"/config/{_quote(subject)}", {"compatibility": level})
        if status != 200:
            raise self._refused(f"setting {subject!r}'s compatibility to {level}", status, payload)


def _quote(subject: str) -> str:
    return urllib.parse.quote(subject, safe="")


def _json(data: bytes, *, strict: bool = True) -> Any:
    try:
        return json.loads(data) if data else None
    except ValueError:
        if strict:
            raise RegistryError("the schema registry answered something that is not JSON") from None
        return None


def _message(payload: Any) -> str:
    return str(payload.get("message", payload))[:500] if isinstance(payload, dict) else str(payload)[:500]


# ------------------------------------------------------------------------------------------ schema ids


def schema_text(schema: SchemaVersion) -> str:
    """The text registered for one of throughline's schemas: its ``.avsc`` as shipped (docs, defaults
    and logical types included: what other tools' readers see)."""
    return json.dumps(schema.source, separators=(",", ":"))


def known_schema(text: str) -> SchemaVersion | None:
    """The throughline schema whose parsing canonical form ``text`` has, or ``None``."""
    try:
        parsed = fastavro.parse_schema(json.loads(text))
        head = bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))
    except Exception:  # a schema fastavro cannot parse is simply not one of ours
        return None
    return codec.schema_by_fingerprint(head)


class SchemaIds:
    """Schema id -> throughline schema, resolved through the registry once per id (bounded cache).

    An id the registry does not hold, or that names a schema throughline does not know, raises
    ``UnknownSchemaIdError`` (the record is quarantined); a registry that does not answer raises
    ``RegistryUnavailableError`` (retriable: the projector retries its poll, it quarantines nothing).
    """

    def __init__(self, client: RegistryClient | None, max_entries: int = MAX_CACHED_IDS) -> None:
        self.client = client
        self._max = max_entries
        self._known: dict[int, SchemaVersion | str] = {}  # a str: why the id is unknown
        self.lookups = 0  # registry calls made (tests check the cache)

    def remember(self, schema_id: int, schema: SchemaVersion) -> None:
        """Record an id a producer registered (no lookup needed to read it back)."""
        self._put(schema_id, schema)

    def _put(self, schema_id: int, value: SchemaVersion | str) -> None:
        if schema_id not in self._known and len(self._known) >= self._max:
            del self._known[next(iter(self._known))]  # the oldest: ids are few, this bounds a hostile topic
        self._known[schema_id] = value

    def resolve(self, schema_id: int) -> SchemaVersion:
        """The schema ``schema_id`` names; raises ``UnknownSchemaIdError`` or ``RegistryUnavailableError``."""
        found = self._known.get(schema_id)
        if found is None:
            found = self._lookup(schema_id)
            self._put(schema_id, found)
        if isinstance(found, str):
            raise UnknownSchemaIdError(found)
        return found

    def _lookup(self, schema_id: int) -> SchemaVersion | str:
        if self.client is None:
            return f"registry-framed record (schema id {schema_id}) but no schema registry is configured"
        self.lookups += 1
        try:
            text = self.client.schema_text(schema_id)
        except UnknownSchemaIdError as exc:
            return exc.message
        if text is None:
            return f"schema id {schema_id} is not in the schema registry"
        schema = known_schema(text)
        if schema is None:
            return f"schema id {schema_id} names a schema this reader does not know"
        return schema


def install(settings: RegistrySettings | None) -> SchemaIds:
    """Make every decoder of this process resolve schema ids through ``settings``' registry (``None``:
    no registry; a registry-framed record is then quarantined as an unknown schema). Installing the
    same settings again keeps the cache."""
    current = codec.schema_ids()
    if isinstance(current, SchemaIds) and (
        (current.client is None and settings is None)
        or (current.client is not None and current.client.settings == settings)
    ):
        return current
    ids = SchemaIds(None if settings is None else RegistryClient(settings))
    codec.set_schema_ids(ids)
    return ids


@dataclass(frozen=True, slots=True)
class WriterHeaders:
    """The Confluent headers a producer writes: one per family."""

    turn: bytes
    repair: bytes
    turn_id: int
    repair_id: int


def value_subject(topic: str) -> str:
    """The subject turns are registered under (Confluent's default ``TopicNameStrategy``)."""
    return f"{topic}-value"


def repair_subject(topic: str) -> str:
    """The subject repairs are registered under (``TopicRecordNameStrategy``: a repair is another record
    type, not a new version of a turn, so ``BACKWARD`` on ``<topic>-value`` would refuse it)."""
    schema = codec.REPAIR_SCHEMAS[codec.CURRENT_REPAIR_VERSION].source
    return f"{topic}-{schema['namespace']}.{schema['name']}"


def _register_one(client: RegistryClient, subject: str, schema: SchemaVersion) -> int:
    text = schema_text(schema)
    known = client.lookup(subject, text)
    if known is not None:
        return known  # every producer start after the first: one call, nothing to check or change
    if client.compatibility(subject) is None:
        client.set_compatibility(subject, COMPATIBILITY)
    compatible, reasons = client.is_compatible(subject, text)
    if not compatible:
        family = "repair" if schema.family == REPAIR else "turn"
        raise SchemaIncompatibleError(
            f"the {family} schema v{schema.version} is not compatible with the latest version under subject "
            f"{subject!r}" + (f": {reasons}" if reasons else " (the registry gave no reasons)") + "; nothing was sent"
        )
    return client.register(subject, text)


def register_writer_schemas(settings: RegistrySettings, topic: str) -> WriterHeaders:
    """Register the current turn and repair schemas for ``topic`` (a new subject gets ``BACKWARD``),
    remember their ids in this process, and return the headers to write. Raises
    ``SchemaIncompatibleError`` before anything is sent when the registry refuses a schema."""
    ids = install(settings)
    assert ids.client is not None
    turn = codec.SCHEMAS[codec.CURRENT_VERSION]
    repair = codec.REPAIR_SCHEMAS[codec.CURRENT_REPAIR_VERSION]
    turn_id = _register_one(ids.client, value_subject(topic), turn)
    repair_id = _register_one(ids.client, repair_subject(topic), repair)
    ids.remember(turn_id, turn)
    ids.remember(repair_id, repair)
    return WriterHeaders(codec.confluent_header(turn_id), codec.confluent_header(repair_id), turn_id, repair_id)
