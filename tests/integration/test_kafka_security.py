"""TLS and SASL end to end against a secured JVM broker (``kafka_secured_broker``), from one properties file.

The whole product runs over the SASL_SSL listener: ``ingest`` -> ``project`` (with its fetch worker) ->
``read`` -> ``status`` -> ``replay`` -> ``serve`` -> ``observe --url``. Each failure the issue names
(a wrong password, an untrusted certificate, a host-name mismatch, a listener of another protocol) has
its own code, within the connect timeout, without a traceback. Every test hands all the output it saw
(stdout and stderr of every process, HTTP answers, every log record of this process down to DEBUG) to
``transcript``, which fails the test if any of the session's passwords appears in it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from throughline.errors import ThroughlineError
from throughline.log import (
    PLAINTEXT,
    CertificateRefusedError,
    KafkaClientConfig,
    KafkaLog,
    describe_topic,
    ensure_topic,
    load_kafka_config,
)
from throughline.producers import TurnProducer
from throughline.projector.runner import Projector, ProjectorOptions
from throughline.projector.store import DuckProjection
from throughline.testing.kafka import ENV_BOOTSTRAP, ExternalKafka, create_topic, provision_kafka
from throughline.testing.kafka.secured import SecuredKafka

KEY_HEX = "3c" * 32
CONNECT_TIMEOUT = 8.0
PROCESS_TIMEOUT = 180.0
PROJECTS = ("/srv/secured/alpha", "/srv/secured/beta")


class Transcript:
    """Everything the tests of one case printed, logged or answered; checked for secrets at the end."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self._lock = threading.Lock()

    def add(self, *texts: str | bytes | None) -> None:
        with self._lock:
            for text in texts:
                if text:
                    self.texts.append(text.decode("utf-8", "replace") if isinstance(text, bytes) else text)

    def assert_no_secret(self, secrets: tuple[str, ...]) -> None:
        assert self.texts, "the transcript is empty: nothing was scanned"
        for text in self.texts:
            for secret in secrets:
                assert secret not in text, f"a password appears in the output:\n{text[:2000]}"


class _Capture(logging.Handler):
    def __init__(self, transcript: Transcript) -> None:
        super().__init__(logging.DEBUG)
        self.transcript = transcript

    def emit(self, record: logging.LogRecord) -> None:
        self.transcript.add(self.format(record))


@pytest.fixture
def transcript(kafka_secured_broker: SecuredKafka) -> Iterator[Transcript]:
    """Collects every output of the test (DEBUG logs of this process included) and scans it for secrets."""
    collected = Transcript()
    handler = _Capture(collected)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s %(args)r"))
    loggers = [logging.getLogger(name) for name in ("kafka", "throughline")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    try:
        yield collected
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(level)
    collected.assert_no_secret(kafka_secured_broker.secrets)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THROUGHLINE_")}
    env["THROUGHLINE_TOKEN_KEY"] = KEY_HEX
    env["PYTHONUNBUFFERED"] = "1"
    return {**env, **extra}


def cli(
    transcript: Transcript, *argv: str, env: dict[str, str] | None = None, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``throughline ARGV`` as a real process; its output goes into the transcript."""
    done = subprocess.run(
        [sys.executable, "-m", "throughline.cli", *argv],
        capture_output=True,
        text=True,
        env=env or _env(),
        input=input,
        timeout=PROCESS_TIMEOUT,
        check=False,
    )
    transcript.add(done.stdout, done.stderr)
    return done


def error_code(done: subprocess.CompletedProcess[str]) -> str:
    """The code of the ``{"error": ...}`` document on the last stderr line."""
    assert "Traceback" not in done.stderr, done.stderr
    return str(json.loads(done.stderr.strip().splitlines()[-1])["error"]["code"])


def turns_jsonl(count: int, first: int = 0) -> str:
    lines = [
        json.dumps(
            {
                "project": PROJECTS[i % 2],
                "host": "host-a",
                "thread": f"thread-{i % 3}",
                "turnId": f"turn-{i:04d}",
                "completedAt": f"2026-02-01T10:{i // 60 % 60:02d}:{i % 60:02d}Z",
                "body": f"secured turn {i}",
            }
        )
        for i in range(first, first + count)
    ]
    return "\n".join(lines) + "\n"


def http(transcript: Transcript, url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            status, body = exc.code, exc.read()
    transcript.add(body)
    return status, json.loads(body) if body[:1] in (b"{", b"[") else body.decode()


# ---------------------------------------------------------------------------------------- end to end


def test_the_product_runs_end_to_end_over_sasl_ssl_from_one_properties_file(
    kafka_secured_broker: SecuredKafka, transcript: Transcript, tmp_path: Path, kafka_topic_name: str
) -> None:
    broker = kafka_secured_broker
    scram = broker.client_config(tmp_path / "scram.properties", "SCRAM-SHA-512")
    plain = broker.client_config(tmp_path / "plain.properties", "PLAIN", overrides={"client.id": "throughline-serve"})
    db = tmp_path / "projection.duckdb"
    flags = ["--bootstrap-servers", broker.sasl_ssl_bootstrap, "--topic", kafka_topic_name]

    ingested = cli(
        transcript, "ingest", "-", *flags, "--kafka-config", str(scram), "--partitions", "2", input=turns_jsonl(40)
    )
    assert ingested.returncode == 0, ingested.stderr
    # The variable instead of the flag; -v logs kafka-python at INFO (what the scan must also survive).
    projected = cli(
        transcript,
        "project",
        "--until-caught-up",
        "-v",
        *flags,
        "--db",
        str(db),
        env=_env(THROUGHLINE_KAFKA_CONFIG=str(scram)),
    )
    assert projected.returncode == 0, projected.stderr
    summary = json.loads(projected.stdout)
    assert summary["records"] == 40 and summary["turns"] == 40 and summary["caughtUp"]

    read = cli(transcript, "read", "--project", PROJECTS[0], *flags, "--db", str(db), "--kafka-config", str(scram))
    assert read.returncode == 0, read.stderr
    page = json.loads(read.stdout)
    assert page["status"] == "ok"  # the head thread of alpha (even turns) is thread 38 % 3
    assert [t["body"] for t in page["turns"]] == [f"secured turn {i}" for i in range(0, 40, 2) if i % 3 == 2]

    status = cli(transcript, "status", "--json", *flags, "--db", str(db), "--kafka-config", str(scram))
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["lag"] == 0 and report["log"]["reachable"] is True
    assert report["log"]["security"]["securityProtocol"] == "SASL_SSL"
    assert report["log"]["security"]["saslMechanism"] == "SCRAM-SHA-512"
    table = cli(transcript, "status", *flags, "--db", str(db), "--kafka-config", str(scram))
    assert "kafka connection: SASL_SSL SCRAM-SHA-512" in table.stdout

    rebuilt = tmp_path / "replayed.duckdb"
    replayed = cli(transcript, "replay", "--no-progress", *flags, "--db", str(rebuilt), "--kafka-config", str(scram))
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["turns"] == 40

    # serve projects into a projection of its own, over SASL_SSL/PLAIN, and the Observer reads over HTTP.
    served_db = tmp_path / "served.duckdb"
    serve_log = tmp_path / "serve.log"
    with open(serve_log, "w", encoding="utf-8") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "throughline.cli",
                "serve",
                "--port",
                "0",
                "--log-level",
                "info",
                *flags,
                "--db",
                str(served_db),
                "--kafka-config",
                str(plain),
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=_env(),
        )
    try:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(PROCESS_TIMEOUT)
        assert lines and lines[0].startswith("http://"), serve_log.read_text()
        url = lines[0].strip()
        deadline = time.monotonic() + PROCESS_TIMEOUT
        while True:
            code, ready = http(transcript, url + "/readyz")
            if code == 200 and ready["lag"] == 0 and sum(p["appliedOffset"] for p in ready["partitions"]) >= 40:
                break
            assert time.monotonic() < deadline, ready
            time.sleep(0.2)
        more = cli(transcript, "ingest", "-", *flags, "--kafka-config", str(scram), input=turns_jsonl(6, first=40))
        assert more.returncode == 0, more.stderr
        observed = cli(
            transcript,
            "observe",
            "--project",
            PROJECTS[1],
            "--state",
            str(tmp_path / "observer.json"),
            "--url",
            url,
            "--limit",
            "100",
        )
        assert observed.returncode == 0, observed.stderr
        audited = [json.loads(line) for line in observed.stdout.splitlines()]
        # First contact is a snapshot of the head thread: beta's turns (odd numbers) on thread 45 % 3.
        assert [t["body"] for t in audited] == [f"secured turn {i}" for i in range(1, 46, 2) if i % 3 == 0]
        for path in ("/healthz", "/readyz", "/metrics"):
            code, _ = http(transcript, url + path)
            assert code == 200, path
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            assert proc.stdout is not None
            transcript.add(proc.stdout.read())
            proc.stdout.close()
            transcript.add(serve_log.read_text(encoding="utf-8", errors="replace"))
    assert "Traceback" not in serve_log.read_text()
    with DuckProjection.open(served_db, read_only=True) as projection:
        assert sum(projection.applied_offsets().values()) == 46


def test_mutual_tls_with_an_encrypted_client_key(
    kafka_secured_broker: SecuredKafka, transcript: Transcript, tmp_path: Path, kafka_topic_name: str
) -> None:
    config = load_kafka_config(kafka_secured_broker.client_config(tmp_path / "mtls.properties", "MTLS"))
    servers = kafka_secured_broker.mtls_bootstrap
    with TurnProducer(
        servers, kafka_topic_name, partitions=1, kafka_config=config, connect_timeout=CONNECT_TIMEOUT
    ) as producer:
        producer.append(project="/srv/mtls", host="h", thread="t", turn_id="one", completed_at=0, body="over mTLS")
    db = tmp_path / "mtls.duckdb"
    with DuckProjection.open(db, topic=kafka_topic_name) as projection:
        options = ProjectorOptions(timeout=CONNECT_TIMEOUT)
        summary = Projector(projection, servers, kafka_topic_name, options=options, kafka_config=config).run(
            until_caught_up=True
        )
    assert summary.summary.appended == 1
    without_certificate = load_kafka_config(
        kafka_secured_broker.client_config(
            tmp_path / "nocert.properties",
            "MTLS",
            overrides={"ssl.certificate.location": None, "ssl.key.location": None, "ssl.key.password": None},
        )
    )
    with pytest.raises(CertificateRefusedError) as refused:
        KafkaLog(servers, kafka_topic_name, timeout=CONNECT_TIMEOUT, kafka_config=without_certificate)
    transcript.add(refused.value.message)
    assert refused.value.exit_code == 2 and not refused.value.retriable


# ---------------------------------------------------------------------------------------- failures


def _failure_cases(broker: SecuredKafka, tmp_path: Path) -> list[tuple[str, str, Path | None, str]]:
    """(name, bootstrap, properties file or None for none, expected code)."""

    def file(name: str, kind: str = "PLAIN", **overrides: str | None) -> Path:
        return broker.client_config(tmp_path / f"{name}.properties", kind, overrides=overrides)

    assert broker.tls is not None
    return [
        (
            "wrong PLAIN password",
            broker.sasl_ssl_bootstrap,
            file("wrong-plain", "PLAIN", **{"sasl.password": "not-it"}),
            "kafka_authentication_failed",
        ),
        (
            "wrong SCRAM password",
            broker.sasl_ssl_bootstrap,
            file("wrong-scram", "SCRAM-SHA-256", **{"sasl.password": "not-it"}),
            "kafka_authentication_failed",
        ),
        (
            "untrusted certificate",
            broker.sasl_ssl_bootstrap,
            file("stranger", "PLAIN", **{"ssl.ca.location": str(broker.tls.other_ca)}),
            "kafka_certificate_untrusted",
        ),
        (
            "host-name mismatch",
            broker.badname_bootstrap,
            file(
                "badname",
                "MTLS",
                **{"ssl.certificate.location": None, "ssl.key.location": None, "ssl.key.password": None},
            ),
            "kafka_hostname_mismatch",
        ),
        (
            "SASL_SSL to a PLAINTEXT listener",
            broker.plaintext_bootstrap,
            file("to-plaintext", "SCRAM-SHA-512"),
            "kafka_protocol_mismatch",
        ),
        ("PLAINTEXT to a SASL_SSL listener", broker.sasl_ssl_bootstrap, None, "kafka_protocol_mismatch"),
        (
            "SSL to a SASL_SSL listener",
            broker.sasl_ssl_bootstrap,
            file(
                "no-sasl",
                "MTLS",
                **{"ssl.certificate.location": None, "ssl.key.location": None, "ssl.key.password": None},
            ),
            "kafka_protocol_mismatch",
        ),
    ]


def _connect(client: str, servers: str, topic: str, config: KafkaClientConfig, db: Path) -> None:
    """Build one kind of client (the way the product does) against ``servers``."""
    if client == "producer":
        TurnProducer(servers, topic, kafka_config=config, connect_timeout=CONNECT_TIMEOUT).close()
    elif client == "log view":
        KafkaLog(servers, topic, timeout=CONNECT_TIMEOUT, kafka_config=config).close()
    elif client == "admin":
        describe_topic(servers, topic, timeout=CONNECT_TIMEOUT, kafka_config=config)
    elif client == "ensure":
        ensure_topic(servers, topic, timeout=CONNECT_TIMEOUT, kafka_config=config)
    else:  # the projector: its checks, its own log view and its fetch worker
        with DuckProjection.open(db, topic=topic) as projection:
            options = ProjectorOptions(timeout=CONNECT_TIMEOUT)
            Projector(projection, servers, topic, options=options, kafka_config=config).run(until_caught_up=True)


def test_every_failure_has_its_own_code_at_once_in_every_client(
    kafka_secured_broker: SecuredKafka, transcript: Transcript, tmp_path: Path, kafka_topic_name: str
) -> None:
    broker = kafka_secured_broker
    create_topic(broker.plaintext_bootstrap, kafka_topic_name, partitions=1)
    for name, servers, path, code in _failure_cases(broker, tmp_path):
        config = PLAINTEXT if path is None else load_kafka_config(path)
        for client in ("producer", "log view", "admin", "ensure", "projector"):
            started = time.monotonic()
            with pytest.raises(ThroughlineError) as failed:
                _connect(client, servers, kafka_topic_name, config, tmp_path / "failing.duckdb")
            elapsed = time.monotonic() - started
            transcript.add(failed.value.message)
            assert failed.value.code == code, (name, client, failed.value.code, failed.value.message)
            assert failed.value.exit_code == 2 and not failed.value.retriable, (name, client)
            assert elapsed < CONNECT_TIMEOUT, f"{name} ({client}) took {elapsed:.1f}s"
    # The same settings with the host-name check off are accepted (the certificate itself is trusted).
    relaxed = load_kafka_config(
        broker.client_config(
            tmp_path / "relaxed.properties",
            "MTLS",
            overrides={
                "ssl.certificate.location": None,
                "ssl.key.location": None,
                "ssl.key.password": None,
                "ssl.endpoint.identification.algorithm": "",
            },
        )
    )
    with KafkaLog(broker.badname_bootstrap, kafka_topic_name, timeout=CONNECT_TIMEOUT, kafka_config=relaxed) as log:
        assert log.end_offsets() == {0: 0}


def test_no_password_reaches_kafka_pythons_debug_log(
    kafka_secured_broker: SecuredKafka, transcript: Transcript, tmp_path: Path, kafka_topic_name: str
) -> None:
    """kafka-python logs its configuration and the bytes it sends at DEBUG (a PLAIN login carries the
    password in the clear); the transcript has every such record of this process."""
    config = load_kafka_config(kafka_secured_broker.client_config(tmp_path / "plain.properties", "PLAIN"))
    servers = kafka_secured_broker.sasl_ssl_bootstrap
    with TurnProducer(servers, kafka_topic_name, partitions=1, kafka_config=config) as producer:
        producer.append(project="/srv/debug", host="h", thread="t", turn_id="one", completed_at=0, body="logged")
    with KafkaLog(servers, kafka_topic_name, kafka_config=config) as log:
        assert log.end_offsets() == {0: 1}
    logged = "\n".join(transcript.texts)
    assert "SaslAuthenticate" in logged and "Starting KafkaAdminClient with configuration" in logged
    assert "'sasl_plain_password': '****'" in logged


@pytest.mark.parametrize(
    ("case", "command"),
    [(0, "ingest"), (1, "project"), (2, "read"), (3, "status"), (4, "serve"), (5, "replay"), (6, "ingest")],
)
def test_the_cli_reports_each_failure_as_a_settings_error(
    kafka_secured_broker: SecuredKafka,
    transcript: Transcript,
    tmp_path: Path,
    kafka_topic_name: str,
    case: int,
    command: str,
) -> None:
    name, servers, path, code = _failure_cases(kafka_secured_broker, tmp_path)[case]
    db = tmp_path / "p.duckdb"
    if command in ("read", "status"):
        DuckProjection.open(db, topic=kafka_topic_name).close()
    flags = ["--bootstrap-servers", servers, "--topic", kafka_topic_name, "--db", str(db)]
    flags += [] if path is None else ["--kafka-config", str(path)]
    argv = {
        "ingest": ["ingest", "-", "--connect-timeout", str(CONNECT_TIMEOUT)],
        "project": ["project", "--until-caught-up"],
        "read": ["read", "--project", "/p"],
        "status": ["status"],
        "serve": ["serve", "--port", "0"],
        "replay": ["replay", "--no-progress"],
    }[command]
    if command == "replay":
        flags[flags.index(str(db))] = str(tmp_path / "new.duckdb")
    started = time.monotonic()
    done = cli(transcript, *argv, *flags, input="")
    elapsed = time.monotonic() - started
    assert done.returncode == 2, (name, command, done.stderr)
    assert error_code(done) == code, (name, command, done.stderr)
    # A failing connection costs the connect timeout at most; the process start costs a few seconds
    # more on a loaded machine, far less than kafka-python's retries (the 10-15 s default timeouts).
    assert elapsed < PROCESS_TIMEOUT
    assert "Unable to bootstrap" not in done.stderr


# ---------------------------------------------------------------------------------------- the harness


def test_the_harness_reaches_a_secured_external_broker(
    kafka_secured_broker: SecuredKafka,
    transcript: Transcript,
    tmp_path: Path,
    kafka_topic_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = kafka_secured_broker.client_config(tmp_path / "external.properties", "SCRAM-SHA-256")
    monkeypatch.setenv(ENV_BOOTSTRAP, kafka_secured_broker.sasl_ssl_bootstrap)
    monkeypatch.setenv("THROUGHLINE_KAFKA_CONFIG", str(path))
    monkeypatch.delenv("THROUGHLINE_KAFKA_PROVIDER", raising=False)
    handle = provision_kafka(timeout_s=60)
    transcript.add(handle.describe())
    assert isinstance(handle, ExternalKafka) and handle.kafka_config == load_kafka_config(path)
    # The harness's own admin client, then throughline's clients (both through THROUGHLINE_KAFKA_CONFIG).
    create_topic(handle.bootstrap_servers, kafka_topic_name, partitions=2, configs={"retention.ms": "-1"})
    with TurnProducer(handle.bootstrap_servers, kafka_topic_name) as producer:  # THROUGHLINE_KAFKA_CONFIG
        producer.append(project="/srv/ext", host="h", thread="t", turn_id="x", completed_at=0, body="external")
    with KafkaLog(handle.bootstrap_servers, kafka_topic_name) as log:
        assert sum(log.end_offsets().values()) == 1
    monkeypatch.setenv(
        "THROUGHLINE_KAFKA_CONFIG",
        str(
            kafka_secured_broker.client_config(
                tmp_path / "wrong.properties", "SCRAM-SHA-256", overrides={"sasl.password": "wrong"}
            )
        ),
    )
    with pytest.raises(Exception) as refused:  # the harness says why at once instead of waiting 30 s
        provision_kafka(timeout_s=60)
    transcript.add(str(refused.value))
    assert "kafka_authentication_failed" in str(refused.value)


def test_an_error_text_carrying_the_password_is_scrubbed_in_every_client(
    kafka_secured_broker: SecuredKafka, tmp_path: Path, kafka_topic_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library error whose text carries the configured password (kafka-python echoing its settings)
    leaves every client (producer, log view, admin, ensure, projector) with ``****`` in its place.

    The broker is real and the listener check logs in with the real password; then kafka-python's
    client constructor raises an error that quotes the password, the way a library's configuration
    error can. The broker itself never echoes a password, so the echo is put in at that seam."""
    import kafka

    broker = kafka_secured_broker
    create_topic(broker.plaintext_bootstrap, kafka_topic_name, partitions=1)
    config = load_kafka_config(broker.client_config(tmp_path / "plain.properties", "PLAIN"))
    (password,) = [s for s in config.secrets() if s]

    def echoing(self: object, **settings: object) -> None:
        raise kafka.errors.KafkaConnectionError(
            f"connection setup failed with sasl_plain_password={settings.get('sasl_plain_password')}"
        )

    for cls in (kafka.KafkaProducer, kafka.KafkaConsumer, kafka.KafkaAdminClient):
        monkeypatch.setattr(cls, "__init__", echoing)
    for client in ("producer", "log view", "admin", "ensure", "projector"):
        with pytest.raises(ThroughlineError) as failed:
            _connect(client, broker.sasl_ssl_bootstrap, kafka_topic_name, config, tmp_path / "echoed.duckdb")
        assert "sasl_plain_password=****" in failed.value.message, (client, failed.value.message)
        assert password not in failed.value.message, (client, failed.value.message)
        assert password not in repr(failed.value) and password not in json.dumps(failed.value.to_json())
