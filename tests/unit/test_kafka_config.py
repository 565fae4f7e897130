"""The Kafka client properties file: every supported property is mapped, everything else is refused."""

from __future__ import annotations

import os
import pickle
import ssl
import subprocess
from pathlib import Path

import pytest

from throughline.commands.options import add_connection_options, settings_from
from throughline.errors import ConfigurationError
from throughline.log import clients
from throughline.log.config import (
    ENV_KAFKA_CONFIG,
    PLAINTEXT,
    KafkaClientConfig,
    Secret,
    config_from_properties,
    load_kafka_config,
    parse_jaas_config,
    parse_properties,
    resolve_kafka_config,
)

CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
KEY = "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n"
PASSWORD = "s3cr3t-Pa55word"


@pytest.fixture
def pem(tmp_path: Path) -> dict[str, Path]:
    files = {"ca": tmp_path / "ca.pem", "cert": tmp_path / "client.pem", "key": tmp_path / "client.key"}
    files["ca"].write_text(CERT)
    files["cert"].write_text(CERT)
    files["key"].write_text(KEY)
    (tmp_path / "both.pem").write_text(KEY + CERT)
    return files


def write(tmp_path: Path, text: str, name: str = "client.properties") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def refused(text: str, tmp_path: Path) -> str:
    with pytest.raises(ConfigurationError) as info:
        load_kafka_config(write(tmp_path, text))
    assert info.value.code == "configuration_error" and info.value.exit_code == 2
    return info.value.message


# ------------------------------------------------------------------------------------------- mapping


def test_every_supported_property_maps_onto_the_config(tmp_path: Path, pem: dict[str, Path]) -> None:
    path = write(
        tmp_path,
        "# a librdkafka-style file\n"
        "security.protocol = sasl_ssl\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        "sasl.username=svc-throughline\n"
        f"sasl.password={PASSWORD}\n"
        "ssl.ca.location=ca.pem\n"  # relative: beside the properties file
        f"ssl.certificate.location={pem['cert']}\n"
        f"ssl.key.location={pem['key']}\n"
        "ssl.key.password=key-pass\n"
        "ssl.endpoint.identification.algorithm=https\n"
        "client.id=audit-pipeline\n",
    )
    config = load_kafka_config(path)
    assert config == KafkaClientConfig(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="svc-throughline",
        sasl_password=Secret(PASSWORD),
        ssl_ca_location=str(pem["ca"].resolve()),
        ssl_certificate_location=str(pem["cert"].resolve()),
        ssl_key_location=str(pem["key"].resolve()),
        ssl_key_password=Secret("key-pass"),
        ssl_check_hostname=True,
        client_id="audit-pipeline",
        source=str(path),
    )
    assert config.uses_tls and config.uses_sasl
    assert config.describe() == {
        "securityProtocol": "SASL_SSL",
        "saslMechanism": "SCRAM-SHA-512",
        "tlsHostnameCheck": True,
        "config": str(path),
    }
    assert set(config.secrets()) == {PASSWORD, "key-pass"}


def test_kafka_python_settings_of_a_config(tmp_path: Path) -> None:
    sasl = KafkaClientConfig(
        security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_username="u", sasl_password=Secret(PASSWORD)
    )
    settings = clients.kafka_settings(sasl, "throughline-log")
    assert settings == {
        "security_protocol": "SASL_PLAINTEXT",
        "client_id": "throughline-log",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "u",
        "sasl_plain_password": PASSWORD,
    }
    assert PASSWORD not in repr(settings)  # kafka-python's admin client logs its configuration
    assert clients.kafka_settings(PLAINTEXT, "x") == {"security_protocol": "PLAINTEXT", "client_id": "x"}
    tls = clients.kafka_settings(
        KafkaClientConfig(security_protocol="SSL", ssl_check_hostname=False, client_id="mine"), "x"
    )
    assert tls["client_id"] == "mine" and tls["security_protocol"] == "SSL"
    context = tls["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.check_hostname is False and context.verify_mode == ssl.CERT_REQUIRED
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2


def test_an_empty_file_and_no_file_are_plaintext(tmp_path: Path) -> None:
    assert load_kafka_config(write(tmp_path, "# nothing here\n\n")) == KafkaClientConfig(
        source=str(tmp_path / "client.properties")
    )
    assert resolve_kafka_config(None, environ={}) is PLAINTEXT
    assert not PLAINTEXT.uses_tls and not PLAINTEXT.uses_sasl and PLAINTEXT.secrets() == ()


def test_java_jaas_config_gives_user_and_password(tmp_path: Path, pem: dict[str, Path]) -> None:
    config = load_kafka_config(
        write(
            tmp_path,
            "security.protocol=SASL_SSL\n"
            "sasl.mechanism=PLAIN\n"
            "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\\n"
            "    username='API_KEY_1' \\\n"
            f"    password='{PASSWORD}';\n"
            f"ssl.truststore.type=PEM\nssl.truststore.location={pem['ca']}\n",
        )
    )
    assert (config.sasl_username, config.sasl_password) == ("API_KEY_1", Secret(PASSWORD))
    assert config.ssl_ca_location == str(pem["ca"].resolve())
    scram = load_kafka_config(
        write(
            tmp_path,
            "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n"
            'sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" '
            'password="a\\\\\\"b";\n',
        )
    )
    assert scram.sasl_password == Secret('a"b')  # properties unescape \\ and \", then JAAS unescapes \"


def test_jaas_tokens_follow_kafkas_parser() -> None:
    login = parse_jaas_config(
        "org.apache.kafka.common.security.scram.ScramLoginModule /* comment */ REQUIRED\n"
        '  username = "al ice" // comment\n  password="p\\tw\\101";'
    )
    assert login.module.endswith("ScramLoginModule")
    assert login.username == "al ice" and login.password == Secret("p\twA")
    assert "p\twA" not in repr(login)


def test_librdkafka_spelling_and_a_pem_keystore(tmp_path: Path) -> None:
    both = tmp_path / "both.pem"
    (tmp_path / "both.pem").write_text(KEY + CERT)
    config = load_kafka_config(
        write(
            tmp_path,
            "security.protocol=SSL\nssl.keystore.type=PEM\n"
            f"ssl.keystore.location={both}\nssl.key.password=kp\nssl.endpoint.identification.algorithm=\n",
        )
    )
    assert config.ssl_certificate_location == config.ssl_key_location == str(both.resolve())
    assert config.ssl_check_hostname is False and config.ssl_ca_location is None
    rd = config_from_properties(
        {"security.protocol": "SASL_SSL", "sasl.mechanisms": "PLAIN", "sasl.username": "u", "sasl.password": "p"}
    )
    assert rd.sasl_mechanism == "PLAIN"


def test_properties_syntax() -> None:
    text = (
        "! a comment\n  # another\n"
        "a=1\nb : two words \nc   spaced\nd\\=key=v\\u00e9\n"
        "e=line one \\\n    continued\nf=back\\\\slash\\\\\n"
        "g=\n"
    )
    assert parse_properties(text) == {
        "a": "1",
        "b": "two words ",
        "c": "spaced",
        "d=key": "vé",
        "e": "line one continued",
        "f": "back\\slash\\",
        "g": "",
    }


# ------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("acks=all\n", "'acks'"),
        ("bootstrap.servers=pkc.example:9092\n", "--bootstrap-servers"),
        ("session.timeout.ms=45000\n", "'session.timeout.ms'"),
        ("ssl.crl.location=x\nsecurity.protocol=SSL\n", "'ssl.crl.location'"),
        ("sasl.kerberos.service.name=kafka\n", "'sasl.kerberos.service.name'"),
        ("security.protocol=TLS\n", "security.protocol"),
        ("security.protocol=SASL_SSL\nsasl.username=u\nsasl.password=p\n", "sasl.mechanism is required"),
        ("security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\n", "OAUTHBEARER"),
        ("security.protocol=SASL_SSL\nsasl.mechanism=GSSAPI\n", "GSSAPI"),
        ("security.protocol=SASL_SSL\nsasl.mechanism=AWS_MSK_IAM\n", "AWS_MSK_IAM"),
        ("security.protocol=SASL_SSL\nsasl.mechanism=DIGEST-MD5\n", "sasl.mechanism must be one of"),
        ("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.username=u\n", "sasl.password is required"),
        ("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.password=p\n", "sasl.username is required"),
        ("sasl.username=u\n", "SASL settings need SASL_SSL or SASL_PLAINTEXT"),
        (
            "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=u\nsasl.password=p\nssl.ca.location=x\n",
            "TLS settings need SSL or SASL_SSL",
        ),
        ("a=1\na=2\n", "'a' is set twice"),
        (
            "security.protocol=SSL\nssl.endpoint.identification.algorithm=strict\n",
            "ssl.endpoint.identification.algorithm",
        ),
        ("security.protocol=SSL\nssl.key.password=k\n", "ssl.key.password is set without ssl.key.location"),
        ("security.protocol=SSL\nssl.ca.location=/nonexistent/ca.pem\n", "ssl.ca.location: cannot read"),
        ("client.id=\n", "client.id is empty"),
        (
            "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-256\nsasl.jaas.config="
            "org.apache.kafka.common.security.plain.PlainLoginModule required username=u password=p;\n",
            "does not log in with sasl.mechanism SCRAM-SHA-256",
        ),
        (
            "security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.jaas.config="
            "com.example.LoginModule required username=u password=p;\n",
            "login module 'com.example.LoginModule'",
        ),
        (
            "security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.jaas.config="
            "org.apache.kafka.common.security.plain.PlainLoginModule required username=u password=p\n",
            "semicolon",
        ),
        (
            "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-256\nsasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required username=u password=p tokenauth=true;\n",
            "option 'tokenauth'",
        ),
        (
            "security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.username=u\nsasl.password=p\nsasl.jaas.config="
            "org.apache.kafka.common.security.plain.PlainLoginModule required username=u password=p;\n",
            "keep one",
        ),
    ],
)
def test_unknown_unsupported_and_contradictory_settings_are_refused(tmp_path: Path, text: str, names: str) -> None:
    message = refused(text, tmp_path)
    assert names in message
    assert str(tmp_path / "client.properties") in message


@pytest.mark.parametrize(
    "text",
    [
        "security.protocol=SSL\nssl.truststore.location=/etc/kafka/truststore.jks\nssl.truststore.password=changeit\n",
        "security.protocol=SSL\nssl.keystore.type=PKCS12\nssl.keystore.location=/etc/kafka/client.p12\n",
        "security.protocol=SSL\nssl.keystore.password=changeit\n",
    ],
)
def test_java_keystores_are_refused_with_how_to_export_pem(tmp_path: Path, text: str) -> None:
    message = refused(text, tmp_path)
    assert "keytool -importkeystore" in message and "openssl pkcs12" in message
    assert "changeit" not in message


def test_a_keystore_given_as_a_pem_location_is_recognised(tmp_path: Path) -> None:
    jks = tmp_path / "truststore.jks"
    jks.write_bytes(b"\xfe\xed\xfe\xed" + os.urandom(64))
    p12 = tmp_path / "client.p12"
    p12.write_bytes(b"\x30\x82" + os.urandom(64))
    assert "Java keystore (JKS)" in refused(f"security.protocol=SSL\nssl.ca.location={jks}\n", tmp_path)
    message = refused(f"security.protocol=SSL\nssl.ca.location={p12}\n", tmp_path)
    assert "PKCS12" in message and "openssl pkcs12" in message


def test_no_refusal_carries_a_secret(tmp_path: Path) -> None:
    texts = [
        f"security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.username=u\nsasl.password={PASSWORD}\nssl.ca.location=/none\n",
        f"security.protocol=PLAINTEXT\nsasl.password={PASSWORD}\n",
        f"security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.jaas.config=org.apache.kafka.common.security.plain."
        f"PlainLoginModule required username=u password={PASSWORD} extra={PASSWORD};\n",
        f"unknown.key={PASSWORD}\n",
        f"sasl.password={PASSWORD}\nsasl.password={PASSWORD}\n",
    ]
    for text in texts:
        assert PASSWORD not in refused(text, tmp_path)


def test_a_config_keeps_its_secrets_out_of_repr_and_survives_pickling(tmp_path: Path) -> None:
    config = config_from_properties(
        {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": PASSWORD}
    )
    assert PASSWORD not in repr(config) and PASSWORD not in str(config)
    again = pickle.loads(pickle.dumps(config))  # the projector's fetch worker gets it through a pipe
    assert again == config and again.sasl_password is not None and again.sasl_password.reveal() == PASSWORD


def test_the_environment_and_the_flag_name_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    flag_file = write(tmp_path, "client.id=from-flag\n", "flag.properties")
    env_file = write(tmp_path, "client.id=from-env\n", "env.properties")
    parser = argparse.ArgumentParser()
    add_connection_options(parser)
    monkeypatch.setenv(ENV_KAFKA_CONFIG, str(env_file))
    assert settings_from(parser.parse_args([])).kafka_config().client_id == "from-env"
    assert settings_from(parser.parse_args(["--kafka-config", str(flag_file)])).kafka_config().client_id == "from-flag"
    assert resolve_kafka_config().client_id == "from-env"  # what a library call without a config uses
    monkeypatch.delenv(ENV_KAFKA_CONFIG)
    assert settings_from(parser.parse_args([])).kafka_config() is PLAINTEXT


def test_a_broken_file_is_a_configuration_error_of_the_cli(tmp_path: Path) -> None:
    bad = write(tmp_path, f"security.protocol=SASL_SSL\nsasl.password={PASSWORD}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("THROUGHLINE_")}
    for command in (["status"], ["project", "--until-caught-up"], ["ingest", "-"], ["read", "--project", "p"]):
        done = subprocess.run(
            [
                str(Path(os.sys.executable).with_name("throughline")),
                *command,
                "--bootstrap-servers",
                "127.0.0.1:9",
                "--kafka-config",
                str(bad),
                "--db",
                str(tmp_path / "x.duckdb"),
            ],
            capture_output=True,
            text=True,
            env=env,
            input="",
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, (command, done.stderr)
        assert '"code": "configuration_error"' in done.stderr
        assert "sasl.mechanism" in done.stderr and PASSWORD not in done.stderr + done.stdout
        assert "Traceback" not in done.stderr


def test_every_command_that_talks_to_kafka_takes_the_flag() -> None:
    from throughline.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices  # argparse keeps them here
    for name in ("ingest", "hook", "project", "replay", "status", "read", "observe", "serve", "repair"):
        flags = {flag for action in commands[name]._actions for flag in action.option_strings}
        assert "--kafka-config" in flags, name
