"""A JVM Kafka broker with secured client listeners, and the PEM files and client configs to reach it.

``SecuredKafka.start()`` makes a per-session CA and certificates with ``openssl`` (PEM throughout: the
broker reads them with ``ssl.keystore.type=PEM``), starts one ``KafkaBroker`` with these listeners on
127.0.0.1, and creates its SCRAM users through the admin API:

========== ============= ========================================================================
listener   protocol      for
========== ============= ========================================================================
PLAINTEXT  PLAINTEXT     inter-broker traffic and the harness's own admin client
SASL_SSL   SASL_SSL      PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 users (certificate for 127.0.0.1)
MTLS       SSL           client certificates required (``ssl.client.auth=required``)
BADNAME    SSL           a certificate for another host name (the host-name mismatch case)
========== ============= ========================================================================

``client_config(...)`` writes a standard Kafka client properties file for any of them, the way a user
would (``security.protocol``, ``sasl.*``, ``ssl.*``). Every password is random per session, so a test
can scan output for it (``secrets``).
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from throughline.testing.kafka.admin import admin_client
from throughline.testing.kafka.config import LOOPBACK, Reporter
from throughline.testing.kafka.exceptions import HarnessError
from throughline.testing.kafka.handle import closed_on_failure
from throughline.testing.kafka.jvm import BrokerSettings, KafkaBroker
from throughline.testing.kafka.support import free_ports, run_tool

OPENSSL_TIMEOUT_S = 60.0
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def _openssl(args: list[str], cwd: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise HarnessError("openssl is not on PATH: the secured broker's certificates are made with it")
    done = run_tool([openssl, *args], cwd=cwd, timeout_s=OPENSSL_TIMEOUT_S, what=f"openssl {args[0]}")
    if done.returncode != 0:
        raise HarnessError(f"openssl {args[0]} failed: {done.stderr.decode(errors='replace')[-800:]}")


@dataclass(frozen=True)
class TlsFiles:
    """The PEM files of one session: a CA, the broker's certificates, a client certificate, a stranger CA."""

    directory: Path
    ca: Path
    broker_keystore: Path  # private key + certificate for 127.0.0.1 (and localhost)
    badname_keystore: Path  # private key + certificate for another host name, same CA
    client_certificate: Path
    client_key: Path  # encrypted with ``client_key_password``
    client_key_password: str
    other_ca: Path  # a CA that signed nothing the broker has (the untrusted-certificate case)


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    _openssl(
        [
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            key.name,
            "-out",
            cert.name,
            "-days",
            "2",
            "-subj",
            f"/CN={name}",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-addext",
            "subjectKeyIdentifier=hash",
        ],
        directory,
    )
    return cert, key


def _leaf(directory: Path, name: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    cert, key, csr, ext = (directory / f"{name}{s}" for s in (".pem", ".key", ".csr", ".ext"))
    ext.write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n" + extensions + "\n",
        encoding="utf-8",
    )
    _openssl(
        [
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            key.name,
            "-out",
            csr.name,
            "-subj",
            f"/CN={name}",
        ],
        directory,
    )
    _openssl(
        [
            "x509",
            "-req",
            "-in",
            csr.name,
            "-CA",
            ca[0].name,
            "-CAkey",
            ca[1].name,
            "-CAcreateserial",
            "-out",
            cert.name,
            "-days",
            "2",
            "-extfile",
            ext.name,
        ],
        directory,
    )
    return cert, key


def make_tls_files(directory: Path) -> TlsFiles:
    """Make a fresh CA and certificates in ``directory`` (about a second of ``openssl``)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca(directory, "throughline-test-ca")
    other = _ca(directory, "stranger-ca")

    def keystore(name: str, san: str, usage: str) -> Path:
        cert, key = _leaf(directory, name, ca, f"extendedKeyUsage={usage}\nsubjectAltName={san}")
        store = directory / f"{name}-keystore.pem"
        store.write_text(key.read_text() + cert.read_text() + ca[0].read_text(), encoding="utf-8")
        return store

    broker = keystore("broker", f"IP:{LOOPBACK},DNS:localhost", "serverAuth")
    badname = keystore("badname", "DNS:not-this-broker.invalid", "serverAuth")
    client_cert, client_plain_key = _leaf(directory, "client", ca, "extendedKeyUsage=clientAuth")
    password = secrets.token_urlsafe(18)
    client_key = directory / "client-encrypted.key"
    _openssl(
        ["pkey", "-in", client_plain_key.name, "-aes256", "-passout", f"pass:{password}", "-out", client_key.name],
        directory,
    )
    client_plain_key.unlink()
    return TlsFiles(directory, ca[0], broker, badname, client_cert, client_key, password, other[0])


@dataclass(frozen=True)
class SaslUser:
    """One SASL user of the secured broker."""

    mechanism: str
    username: str
    password: str


def _listener_properties(
    ports: Mapping[str, int], controller_port: int, files: TlsFiles, plain: SaslUser
) -> tuple[tuple[str, str], ...]:
    listeners = ",".join(f"{name}://{LOOPBACK}:{port}" for name, port in ports.items())
    return (
        ("listeners", f"{listeners},CONTROLLER://{LOOPBACK}:{controller_port}"),
        ("advertised.listeners", listeners),
        (
            "listener.security.protocol.map",
            "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL,MTLS:SSL,BADNAME:SSL",
        ),
        ("ssl.keystore.type", "PEM"),
        ("ssl.keystore.location", str(files.broker_keystore)),
        ("ssl.truststore.type", "PEM"),
        ("ssl.truststore.location", str(files.ca)),
        ("listener.name.badname.ssl.keystore.location", str(files.badname_keystore)),
        ("listener.name.mtls.ssl.client.auth", "required"),
        ("sasl.enabled.mechanisms", ",".join(("PLAIN", *SCRAM_MECHANISMS))),
        (
            "listener.name.sasl_ssl.plain.sasl.jaas.config",
            f'org.apache.kafka.common.security.plain.PlainLoginModule required user_{plain.username}="{plain.password}";',
        ),
        *(
            (
                f"listener.name.sasl_ssl.{m.lower()}.sasl.jaas.config",
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            )
            for m in SCRAM_MECHANISMS
        ),
    )


class SecuredKafka:
    """A JVM broker with SASL_SSL, mutual-TLS and wrong-host-name TLS listeners (see the module doc)."""

    provider = "jvm-secured"

    def __init__(self, *, report: Reporter | None = None) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="throughline-secured-"))
        self._report = report
        self.tls: TlsFiles | None = None
        self.users: dict[str, SaslUser] = {}
        self.ports: dict[str, int] = {}
        self._broker: KafkaBroker | None = None
        self.startup_s: float | None = None

    def start(self) -> SecuredKafka:
        """Make the certificates, start the broker, create the SCRAM users (bounded waits throughout)."""
        started = time.monotonic()
        with closed_on_failure(self):
            self.tls = make_tls_files(self._dir / "tls")
            self.users = {
                m: SaslUser(m, f"tl-{m.lower().replace('-', '')}", secrets.token_urlsafe(18))
                for m in ("PLAIN", *SCRAM_MECHANISMS)
            }
            picked = free_ports(5)
            self.ports = dict(zip(("PLAINTEXT", "SASL_SSL", "MTLS", "BADNAME"), picked, strict=False))
            settings = BrokerSettings(
                port=self.ports["PLAINTEXT"],
                controller_port=picked[-1],
                extra_properties=_listener_properties(self.ports, picked[-1], self.tls, self.users["PLAIN"]),
            )
            self._broker = KafkaBroker(settings=settings, report=self._report)
            self._broker.start()
            self._add_scram_users()
        self.startup_s = time.monotonic() - started
        return self

    def _add_scram_users(self) -> None:
        from kafka.admin import UserScramCredentialUpsertion

        admin = admin_client(self.plaintext_bootstrap, 30.0)
        try:
            alterations = [
                UserScramCredentialUpsertion(u.username, m, u.password) for m, u in self.users.items() if m != "PLAIN"
            ]
            failed = {user: error for user, error in admin.alter_user_scram_credentials(alterations).items() if error}
            if failed:
                raise HarnessError(f"creating the SCRAM users failed: {failed}")
        finally:
            admin.close()

    # -- addresses ---------------------------------------------------------------------------

    def _address(self, listener: str) -> str:
        if listener not in self.ports:
            raise HarnessError("the secured broker is not started")
        return f"{LOOPBACK}:{self.ports[listener]}"

    @property
    def plaintext_bootstrap(self) -> str:
        """The PLAINTEXT listener (what the harness itself uses)."""
        return self._address("PLAINTEXT")

    @property
    def sasl_ssl_bootstrap(self) -> str:
        """The SASL_SSL listener (PLAIN and SCRAM users, certificate for 127.0.0.1)."""
        return self._address("SASL_SSL")

    @property
    def mtls_bootstrap(self) -> str:
        """The SSL listener that requires a client certificate."""
        return self._address("MTLS")

    @property
    def badname_bootstrap(self) -> str:
        """An SSL listener whose certificate names another host."""
        return self._address("BADNAME")

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every password of this broker's users and files (what no output may contain)."""
        values = [u.password for u in self.users.values()]
        if self.tls is not None:
            values.append(self.tls.client_key_password)
        return tuple(values)

    def describe(self) -> str:
        """One line for the test report."""
        return (
            f"secured JVM broker: SASL_SSL {self.sasl_ssl_bootstrap}, mTLS {self.mtls_bootstrap}, "
            f"bad host name {self.badname_bootstrap}, PLAINTEXT {self.plaintext_bootstrap}"
        )

    # -- client configs ----------------------------------------------------------------------

    def client_properties(self, kind: str = "PLAIN", *, overrides: Mapping[str, str | None] | None = None) -> str:
        """A client properties file's text for ``kind``: a SASL mechanism (``PLAIN``, ``SCRAM-SHA-256``,
        ``SCRAM-SHA-512``, for the SASL_SSL listener) or ``MTLS``. ``overrides`` set (or, with ``None``,
        drop) keys."""
        assert self.tls is not None
        props: dict[str, str | None]
        if kind == "MTLS":
            props = {
                "security.protocol": "SSL",
                "ssl.ca.location": str(self.tls.ca),
                "ssl.certificate.location": str(self.tls.client_certificate),
                "ssl.key.location": str(self.tls.client_key),
                "ssl.key.password": self.tls.client_key_password,
            }
        else:
            user = self.users[kind]
            props = {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": kind,
                "sasl.username": user.username,
                "sasl.password": user.password,
                "ssl.ca.location": str(self.tls.ca),
            }
        props.update(overrides or {})
        lines = [f"# throughline test client: {kind}"] + [f"{k}={v}" for k, v in props.items() if v is not None]
        return "\n".join(lines) + "\n"

    def client_config(
        self, path: Path, kind: str = "PLAIN", *, overrides: Mapping[str, str | None] | None = None
    ) -> Path:
        """Write ``client_properties(kind, overrides=...)`` to ``path``; return it."""
        path.write_text(self.client_properties(kind, overrides=overrides), encoding="utf-8")
        return path

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the broker and remove the certificates."""
        broker, self._broker = self._broker, None
        if broker is not None:
            broker.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> SecuredKafka:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
