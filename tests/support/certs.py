"""Throwaway TLS certificates for tests (``cryptography``), written into a test's tmp_path.

``make_pki(folder)`` writes a CA, a server certificate for 127.0.0.1/localhost (usable as a client
certificate too, as a group member presents it), an expired one, one for another host, and a second,
unrelated CA; every file is PEM. Loopback names only.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    """Paths of the files ``make_pki`` wrote."""

    ca: Path
    other_ca: Path
    cert: Path
    key: Path
    expired_cert: Path
    expired_key: Path
    wrong_host_cert: Path
    wrong_host_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


def _ca(folder: Path, name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, Path]:
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    path = folder / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key, path


def _leaf(
    folder: Path,
    name: str,
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    *,
    hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
    expired: bool = False,
) -> tuple[Path, Path]:
    key = _key()
    now = dt.datetime.now(dt.UTC)
    start, end = (
        (now - dt.timedelta(days=10), now - dt.timedelta(days=1))
        if expired
        else (now - dt.timedelta(days=1), now + dt.timedelta(days=30))
    )
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = folder / f"{name}.crt", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key_path, key)
    return cert_path, key_path


def make_pki(folder: Path) -> Pki:
    """Write the CA, the certificates and their keys into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key, ca_path = _ca(folder, "test-ca")
    _, _, other_ca_path = _ca(folder, "other-ca")
    cert, key = _leaf(folder, "server", ca, ca_key)
    expired_cert, expired_key = _leaf(folder, "expired", ca, ca_key, expired=True)
    wrong_cert, wrong_key = _leaf(folder, "wrong-host", ca, ca_key, hosts=("other.example",))
    return Pki(ca_path, other_ca_path, cert, key, expired_cert, expired_key, wrong_cert, wrong_key)
