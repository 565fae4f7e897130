"""The Kafka client settings throughline reads from a standard client properties file.

``--kafka-config FILE`` / ``THROUGHLINE_KAFKA_CONFIG`` name a Java-style properties file (``key=value``,
``#``/``!`` comments, ``\\`` line continuations) with the property names users already have from their
Java or librdkafka clients. This module turns it into one frozen ``KafkaClientConfig``; the Kafka
edge (``throughline.log.clients``) maps that onto kafka-python. It imports nothing of kafka-python.

Every key is either used or refused: an unknown or unsupported key, a contradiction (TLS files with a
plain-text protocol, a password without a user) or a Java keystore is a ``ConfigurationError``
(``configuration_error``, exit 2) naming the key. No message ever carries a value that could be a secret.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from throughline.errors import ConfigurationError
from throughline.log.registry_keys import REGISTRY_KEYS
from throughline.schemas.registry import RegistrySettings

ENV_KAFKA_CONFIG = "THROUGHLINE_KAFKA_CONFIG"
#: Largest properties file read (a client config is a few hundred bytes).
MAX_CONFIG_BYTES = 64 * 1024
#: How much of a TLS file is read to check that it is PEM (a CA bundle is a few hundred KiB).
MAX_PEM_BYTES = 16 * 1024 * 1024

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

_LOGIN_MODULES = {
    "org.apache.kafka.common.security.plain.PlainLoginModule": ("PLAIN",),
    "org.apache.kafka.common.security.scram.ScramLoginModule": ("SCRAM-SHA-256", "SCRAM-SHA-512"),
}

#: Mechanisms kafka-python has but that cannot be configured from a properties file (each needs code:
#: a Kerberos ticket cache, a token-provider object, AWS credentials).
_UNSUPPORTED_MECHANISMS = {
    "GSSAPI": "Kerberos (GSSAPI) is not supported",
    "OAUTHBEARER": "OAUTHBEARER needs a token provider in code; kafka-python offers no provider configured "
    "from properties (use SASL/SCRAM or PLAIN credentials)",
    "AWS_MSK_IAM": "AWS_MSK_IAM is not supported (use MSK's SASL/SCRAM listener)",
}

PEM_EXPORT_HOWTO = (
    "throughline reads PEM files only. Export them from the Java keystores with keytool and openssl: "
    "`keytool -importkeystore -srckeystore client.jks -destkeystore client.p12 -deststoretype PKCS12`, then "
    "`openssl pkcs12 -in truststore.p12 -nokeys -out ca.pem` (ssl.ca.location), "
    "`openssl pkcs12 -in client.p12 -clcerts -nokeys -out client.pem` (ssl.certificate.location) and "
    "`openssl pkcs12 -in client.p12 -nocerts -out client.key` (ssl.key.location; its pass phrase is "
    "ssl.key.password). See docs/kafka.md"
)

#: Keys of Java keystores: refused unless the store is PEM (``ssl.*store.type=PEM``).
_KEYSTORE_KEYS = (
    "ssl.truststore.location",
    "ssl.truststore.type",
    "ssl.truststore.password",
    "ssl.truststore.certificates",
    "ssl.keystore.location",
    "ssl.keystore.type",
    "ssl.keystore.password",
    "ssl.keystore.certificate.chain",
    "ssl.keystore.key",
)

_TLS_KEYS = (
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
)
_SASL_KEYS = ("sasl.mechanism", "sasl.username", "sasl.password", "sasl.jaas.config")

#: Every key read from the file (``sasl.mechanisms`` is librdkafka's spelling of ``sasl.mechanism``).
SUPPORTED_KEYS = (
    "security.protocol",
    *_SASL_KEYS,
    "sasl.mechanisms",
    *_TLS_KEYS,
    "client.id",
    *_KEYSTORE_KEYS,
    *REGISTRY_KEYS,
)

_KEY_HINTS = {
    "bootstrap.servers": "name the cluster with --bootstrap-servers / THROUGHLINE_BOOTSTRAP_SERVERS",
    "metadata.broker.list": "name the cluster with --bootstrap-servers / THROUGHLINE_BOOTSTRAP_SERVERS",
}
_PREFIX_HINTS = (
    ("sasl.kerberos.", "Kerberos (GSSAPI) is not supported"),
    ("sasl.oauthbearer.", "OAUTHBEARER is not supported"),
    ("sasl.login.", "SASL login callbacks are not supported"),
    (
        "ssl.",
        "throughline supports ssl.ca.location, ssl.certificate.location, ssl.key.location, "
        "ssl.key.password and ssl.endpoint.identification.algorithm",
    ),
)


class Secret:
    """A password kept out of every ``repr``, ``str`` and log line; ``reveal()`` gives the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The secret itself (hand it only to the Kafka client)."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('****')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))

    def __getstate__(self) -> str:
        return self._value

    def __setstate__(self, state: str) -> None:
        self._value = state


@dataclass(frozen=True, slots=True)
class KafkaClientConfig:
    """How throughline's Kafka clients connect: protocol, SASL credentials, TLS files, client id.

    The default is what the clients did before any file existed: PLAINTEXT, no credentials. Paths are
    absolute (resolved against the properties file's folder). ``source`` names the file, for messages.
    """

    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = None
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: Secret | None = None
    ssl_check_hostname: bool = True
    client_id: str | None = None
    source: str | None = None
    #: The schema registry producers register with and readers resolve schema ids through (``None``: none).
    schema_registry: RegistrySettings | None = None

    @property
    def uses_tls(self) -> bool:
        """Whether connections are TLS (``SSL`` or ``SASL_SSL``)."""
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        """Whether connections authenticate with SASL (``SASL_PLAINTEXT`` or ``SASL_SSL``)."""
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def secrets(self) -> tuple[str, ...]:
        """The secret values, so that error texts can be scrubbed of them."""
        own = tuple(s.reveal() for s in (self.sasl_password, self.ssl_key_password) if s is not None and s.reveal())
        return own + (self.schema_registry.secrets() if self.schema_registry is not None else ())

    def describe(self) -> dict[str, Any]:
        """What ``status`` shows: the protocol and mechanism (never a credential or a path)."""
        return {
            "securityProtocol": self.security_protocol,
            "saslMechanism": self.sasl_mechanism,
            "tlsHostnameCheck": self.ssl_check_hostname if self.uses_tls else None,
            "config": self.source,
        }

    def label(self) -> str:
        """``SASL_SSL/SCRAM-SHA-512``-style summary for messages."""
        return f"{self.security_protocol}/{self.sasl_mechanism}" if self.sasl_mechanism else self.security_protocol


PLAINTEXT = KafkaClientConfig()


# ------------------------------------------------------------------------------------ properties files


def _refuse(message: str, source: str | None) -> ConfigurationError:
    where = f" ({source})" if source else ""
    return ConfigurationError(f"Kafka client config{where}: {message}")


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str, source: str | None, line: int) -> str:
    """Java ``Properties`` escapes: ``\\t \\n \\r \\f``, ``\\uXXXX``; any other ``\\c`` is ``c``."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "\\" or i + 1 >= len(text):
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u":
            digits = text[i + 2 : i + 6]
            if len(digits) != 4 or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise _refuse(f"line {line}: malformed \\uXXXX escape", source)
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Natural lines joined where a line ends in an odd number of backslashes (Java ``Properties``)."""
    result: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(re.split(r"\r\n|\r|\n", text), start=1):
        line = raw.lstrip(" \t\f") if pending else raw
        if not pending:
            stripped = line.lstrip(" \t\f")
            if not stripped or stripped[0] in "#!":
                continue
            line, start = stripped, number
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending.append(line[:-1])
            continue
        pending.append(line)
        result.append((start, "".join(pending)))
        pending = []
    if pending:
        result.append((start, "".join(pending)))
    return result


def parse_properties(text: str, source: str | None = None) -> dict[str, str]:
    """The ``key -> value`` pairs of a Java-style properties text.

    Keys end at the first unescaped ``=``, ``:`` or white space; values keep inner white space and lose
    the leading one. A key given twice is refused (one of the two would be ignored).
    """
    found: dict[str, str] = {}
    for line_no, line in _logical_lines(text):
        i, n = 0, len(line)
        while i < n and line[i] not in "=: \t\f":
            i += 2 if line[i] == "\\" and i + 1 < n else 1
        raw_key, rest = line[:i], line[i:]
        rest = rest.lstrip(" \t\f")
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip(" \t\f")
        key = _unescape(raw_key, source, line_no)
        if key in found:
            raise _refuse(f"line {line_no}: {key!r} is set twice", source)
        found[key] = _unescape(rest, source, line_no)
    return found


# ------------------------------------------------------------------------------------------ JAAS


_JAAS_WORD_END = set(" \t\r\n;='\"/") | {chr(c) for c in range(33)}


def _jaas_tokens(text: str) -> list[tuple[str, str]]:
    """Tokens of a JAAS entry as Kafka's ``JaasConfig`` reads them: ``("word"|"quoted"|"op", text)``.

    White space is every character up to ``' '``; ``;`` and ``=`` are operators; ``'`` and ``"`` quote
    (with ``StreamTokenizer``'s backslash escapes); ``//``, ``/* */`` and a lone ``/`` start comments.
    """
    tokens: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ord(ch) <= 32:
            i += 1
        elif ch in ";=":
            tokens.append(("op", ch))
            i += 1
        elif ch == "/":
            if text.startswith("/*", i):
                end = text.find("*/", i + 2)
                i = n if end < 0 else end + 2
            else:  # "//" and a lone "/" both comment out the rest of the line
                end = text.find("\n", i)
                i = n if end < 0 else end + 1
        elif ch in "'\"":
            value, i = _jaas_quoted(text, i + 1, ch)
            tokens.append(("quoted", value))
        else:
            j = i
            while j < n and text[j] not in _JAAS_WORD_END:
                j += 1
            tokens.append(("word", text[i:j]))
            i = j
    return tokens


_JAAS_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def _jaas_quoted(text: str, i: int, quote: str) -> tuple[str, int]:
    out: list[str] = []
    n = len(text)
    while i < n and text[i] != quote and text[i] not in "\r\n":
        ch = text[i]
        if ch == "\\" and i + 1 < n:
            nxt = text[i + 1]
            if nxt in "01234567":
                j = i + 1
                while j < n and j < i + 4 and text[j] in "01234567":
                    j += 1
                out.append(chr(int(text[i + 1 : j], 8)))
                i = j
                continue
            out.append(_JAAS_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out), i + 1


@dataclass(frozen=True, slots=True)
class JaasLogin:
    """The one login module of a ``sasl.jaas.config`` value and its user and password."""

    module: str
    username: str
    password: Secret


def parse_jaas_config(value: str, source: str | None = None) -> JaasLogin:
    """Read ``<LoginModule> required username="..." password="...";`` (PLAIN or SCRAM login modules).

    Refused: another login module, more than one entry, an option other than ``username`` and
    ``password``, a missing option or semicolon. Messages name options, never their values.
    """
    tokens = _jaas_tokens(value)
    if len(tokens) < 2 or tokens[0][0] != "word" or tokens[1][0] != "word":
        raise _refuse('sasl.jaas.config: expected `<LoginModule> required username="..." password="...";`', source)
    module, flag = tokens[0][1], tokens[1][1]
    if module not in _LOGIN_MODULES:
        raise _refuse(
            f"sasl.jaas.config: login module {module!r} is not supported (use "
            + " or ".join(sorted(_LOGIN_MODULES))
            + ")",
            source,
        )
    if flag.lower() not in ("required", "requisite", "sufficient", "optional"):
        raise _refuse(f"sasl.jaas.config: {flag!r} is not a login module control flag (use `required`)", source)
    options: dict[str, str] = {}
    i = 2
    while i < len(tokens) and tokens[i] != ("op", ";"):
        kind, name = tokens[i]
        if kind != "word":
            raise _refuse("sasl.jaas.config: expected an option name", source)
        if i + 2 >= len(tokens) or tokens[i + 1] != ("op", "=") or tokens[i + 2][0] == "op":
            raise _refuse(f"sasl.jaas.config: no value for option {name!r}", source)
        if name not in ("username", "password"):
            raise _refuse(f"sasl.jaas.config: option {name!r} is not supported (only username and password)", source)
        if name in options:
            raise _refuse(f"sasl.jaas.config: option {name!r} is set twice", source)
        options[name] = tokens[i + 2][1]
        i += 3
    if i >= len(tokens):
        raise _refuse("sasl.jaas.config: the entry does not end with a semicolon", source)
    if i + 1 < len(tokens):
        raise _refuse("sasl.jaas.config: only one login module entry is supported", source)
    for name in ("username", "password"):
        if not options.get(name):
            raise _refuse(f"sasl.jaas.config: option {name!r} is missing or empty", source)
    return JaasLogin(module, options["username"], Secret(options["password"]))


# ------------------------------------------------------------------------------------------ files


def _pem_file(key: str, value: str, base: Path | None, source: str | None, *, want: str) -> str:
    """An absolute path to a readable PEM file holding ``want`` (``CERTIFICATE`` or ``PRIVATE KEY``)."""
    if not value:
        raise _refuse(f"{key} is empty", source)
    path = Path(value).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    try:
        with open(path, "rb") as handle:
            head = handle.read(MAX_PEM_BYTES)
    except OSError as exc:
        raise _refuse(f"{key}: cannot read {path} ({exc.strerror or exc})", source) from None
    if head[:4] == b"\xfe\xed\xfe\xed" or head[:4] == b"\xce\xce\xce\xce":
        raise _refuse(f"{key}: {path} is a Java keystore (JKS). {PEM_EXPORT_HOWTO}", source)
    if b"-----BEGIN" not in head:
        kind = "a PKCS12 or DER file" if head[:1] == b"\x30" else "not a PEM file"
        raise _refuse(f"{key}: {path} is {kind}. {PEM_EXPORT_HOWTO}", source)
    if want == "PRIVATE KEY" and not re.search(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----", head):
        raise _refuse(f"{key}: {path} holds no PEM private key", source)
    if want == "CERTIFICATE" and b"-----BEGIN CERTIFICATE-----" not in head:
        raise _refuse(f"{key}: {path} holds no PEM certificate", source)
    return str(path.resolve())


def _keystore_aliases(props: dict[str, str], source: str | None) -> None:
    """Java PEM stores (``ssl.*store.type=PEM``) become ``ssl.ca.location`` / certificate + key; any
    other keystore key is refused with how to export PEM."""
    for store in ("truststore", "keystore"):
        kind = props.pop(f"ssl.{store}.type", None)
        location = props.pop(f"ssl.{store}.location", None)
        if kind is None and location is None:
            continue
        if (kind or "JKS").upper() != "PEM":
            key = f"ssl.{store}.type" if kind is not None else f"ssl.{store}.location"
            raise _refuse(f"{key}: Java keystores ({kind or 'JKS'}) are not supported. {PEM_EXPORT_HOWTO}", source)
        if location is None:
            raise _refuse(f"ssl.{store}.type=PEM needs ssl.{store}.location (inline PEM is not supported)", source)
        targets = ("ssl.ca.location",) if store == "truststore" else ("ssl.certificate.location", "ssl.key.location")
        for target in targets:
            if target in props:
                raise _refuse(f"ssl.{store}.location and {target} both name the same file role; keep one", source)
            props[target] = location
    for key in _KEYSTORE_KEYS:
        if key in props:
            raise _refuse(f"{key}: Java keystore settings are not supported. {PEM_EXPORT_HOWTO}", source)


def _unknown_key(key: str) -> str:
    hint = _KEY_HINTS.get(key)
    if hint is None:
        hint = next((h for prefix, h in _PREFIX_HINTS if key.startswith(prefix)), None)
    if hint is None:
        hint = (
            "only security settings and client.id are read from this file (throughline tunes its own "
            "producers and consumers)"
        )
    return f"unknown or unsupported property {key!r}: {hint}"


def config_from_properties(
    properties: Mapping[str, str], *, source: str | None = None, base: Path | None = None
) -> KafkaClientConfig:
    """Validate a file's properties and map them onto a ``KafkaClientConfig``.

    ``base`` is the folder relative TLS paths are resolved against (the properties file's own).
    """
    props = dict(properties)
    from throughline.log.registry_config import registry_from_properties  # it reads this module's helpers

    registry = registry_from_properties(props, base, source)
    _keystore_aliases(props, source)
    for key in props:
        if key not in SUPPORTED_KEYS:
            raise _refuse(_unknown_key(key), source)
    if "sasl.mechanisms" in props:
        if "sasl.mechanism" in props:
            raise _refuse("sasl.mechanism and sasl.mechanisms (librdkafka's spelling) are both set; keep one", source)
        props["sasl.mechanism"] = props.pop("sasl.mechanisms")

    protocol = props.get("security.protocol", "PLAINTEXT").strip().upper()
    if protocol not in PROTOCOLS:
        raise _refuse(f"security.protocol must be one of {', '.join(PROTOCOLS)}", source)
    tls = protocol in ("SSL", "SASL_SSL")
    sasl = protocol in ("SASL_PLAINTEXT", "SASL_SSL")
    for key in _TLS_KEYS:
        if key in props and not tls:
            raise _refuse(
                f"{key} is set but security.protocol is {protocol} (TLS settings need SSL or SASL_SSL)", source
            )
    for key in _SASL_KEYS:
        if key in props and not sasl:
            raise _refuse(
                f"{key} is set but security.protocol is {protocol} (SASL settings need SASL_SSL or SASL_PLAINTEXT)",
                source,
            )

    mechanism = username = None
    password: Secret | None = None
    if sasl:
        mechanism, username, password = _sasl_settings(props, source)

    check_hostname = True
    if "ssl.endpoint.identification.algorithm" in props:
        algorithm = props["ssl.endpoint.identification.algorithm"].strip().lower()
        if algorithm not in ("https", "", "none"):
            raise _refuse("ssl.endpoint.identification.algorithm must be `https` or empty (`none`)", source)
        check_hostname = algorithm == "https"
    ca = cert = key_file = None
    key_password: Secret | None = None
    if "ssl.ca.location" in props:
        ca = _pem_file("ssl.ca.location", props["ssl.ca.location"], base, source, want="CERTIFICATE")
    if "ssl.certificate.location" in props:
        cert = _pem_file(
            "ssl.certificate.location", props["ssl.certificate.location"], base, source, want="CERTIFICATE"
        )
    if "ssl.key.location" in props:
        if cert is None:
            raise _refuse("ssl.key.location is set without ssl.certificate.location", source)
        key_file = _pem_file("ssl.key.location", props["ssl.key.location"], base, source, want="PRIVATE KEY")
    elif cert is not None:
        raise _refuse("ssl.certificate.location is set without ssl.key.location", source)
    if "ssl.key.password" in props:
        if key_file is None:
            raise _refuse("ssl.key.password is set without ssl.key.location", source)
        key_password = Secret(props["ssl.key.password"])

    client_id = None
    if "client.id" in props:
        client_id = props["client.id"].strip()
        if not client_id:
            raise _refuse("client.id is empty", source)
    return KafkaClientConfig(
        security_protocol=protocol,
        sasl_mechanism=mechanism,
        sasl_username=username,
        sasl_password=password,
        ssl_ca_location=ca,
        ssl_certificate_location=cert,
        ssl_key_location=key_file,
        ssl_key_password=key_password,
        ssl_check_hostname=check_hostname,
        client_id=client_id,
        source=source,
        schema_registry=registry,
    )


def _sasl_settings(props: dict[str, str], source: str | None) -> tuple[str, str, Secret]:
    if "sasl.mechanism" not in props:
        raise _refuse(
            f"sasl.mechanism is required with SASL (one of {', '.join(MECHANISMS)}; the Java default GSSAPI "
            "is not supported)",
            source,
        )
    mechanism = props["sasl.mechanism"].strip().upper()
    if mechanism in _UNSUPPORTED_MECHANISMS:
        raise _refuse(f"sasl.mechanism {mechanism}: {_UNSUPPORTED_MECHANISMS[mechanism]}", source)
    if mechanism not in MECHANISMS:
        raise _refuse(f"sasl.mechanism must be one of {', '.join(MECHANISMS)}", source)
    jaas = props.get("sasl.jaas.config")
    if jaas is not None:
        if "sasl.username" in props or "sasl.password" in props:
            raise _refuse("sasl.jaas.config and sasl.username/sasl.password are both set; keep one", source)
        login = parse_jaas_config(jaas, source)
        if mechanism not in _LOGIN_MODULES[login.module]:
            raise _refuse(
                f"sasl.jaas.config uses {login.module.rsplit('.', 1)[-1]}, which does not log in with "
                f"sasl.mechanism {mechanism}",
                source,
            )
        return mechanism, login.username, login.password
    for key in ("sasl.username", "sasl.password"):
        if not props.get(key):
            raise _refuse(f"{key} is required with sasl.mechanism {mechanism} (or give sasl.jaas.config)", source)
    return mechanism, props["sasl.username"], Secret(props["sasl.password"])


def load_kafka_config(path: str | os.PathLike[str]) -> KafkaClientConfig:
    """Read and validate a Kafka client properties file (UTF-8)."""
    file = Path(path).expanduser()
    source = str(file)
    try:
        with open(file, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise _refuse(f"cannot read the file ({exc.strerror or exc})", source) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise _refuse(f"the file is larger than {MAX_CONFIG_BYTES} bytes", source)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise _refuse("the file is not UTF-8", source) from None
    return config_from_properties(parse_properties(text, source), source=source, base=file.resolve().parent)


def resolve_kafka_config(path: str | None = None, environ: Mapping[str, str] | None = None) -> KafkaClientConfig:
    """The config to use: the file ``path`` names, else ``THROUGHLINE_KAFKA_CONFIG``'s, else PLAINTEXT."""
    env = os.environ if environ is None else environ
    chosen = path or env.get(ENV_KAFKA_CONFIG) or None
    return PLAINTEXT if chosen is None else load_kafka_config(chosen)
