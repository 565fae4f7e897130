"""Every kafka-python client throughline uses is built here: producers, consumers, admin clients.

One builder applies what every client needs alike: the connection's ``KafkaClientConfig`` (security
protocol, SASL credentials, TLS context, ``client.id``), the bounded bootstrap, the short reconnect
backoff, and the listener check of ``throughline.log.probe`` that turns a wrong password, an untrusted
certificate, a host-name mismatch or a listener of another protocol into its own typed error within
the connect timeout (instead of kafka-python's retries ending in "Unable to bootstrap"). A kafka-python
error raised while building is translated by ``throughline.log.translate``.

``kafka_config=None`` means ``resolve_kafka_config()``: the file ``THROUGHLINE_KAFKA_CONFIG`` names, else
PLAINTEXT. Secrets reach kafka-python wrapped so that its ``repr`` (the admin client logs its whole
configuration at DEBUG) shows ``'****'``, and kafka-python's loggers get a filter that masks them in
any record (at DEBUG it logs the bytes it sends, a SASL/PLAIN login included). Neither costs anything
unless DEBUG logging of ``kafka`` is switched on: records below a logger's level are never made.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient

from throughline.errors import ConfigurationError
from throughline.log.config import KafkaClientConfig, resolve_kafka_config
from throughline.log.probe import check_listener
from throughline.log.translate import KafkaErrors

#: Longest wait between two reconnection attempts of our Kafka clients. kafka-python's backoff grows
#: towards 30 s while a broker is away, so clients noticed a restarted broker up to ~40 s late.
RECONNECT_BACKOFF_MAX_MS = 2000
#: The listener check's share of the connect timeout at most (it takes milliseconds when the broker
#: answers; a broker that accepts connections but does not answer leaves the rest to the client).
PROBE_MAX_S = 5.0

C = TypeVar("C")


class _Masked(str):
    """A secret handed to kafka-python: the string itself, but ``'****'`` in any ``repr``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'****'"


class _SecretFilter(logging.Filter):
    """Masks every secret a client of this process was built with in kafka-python's log records."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: set[str] = set()  # each secret as text, and as it shows inside a bytes repr
        self.lock = threading.Lock()

    def add(self, secrets: Sequence[str]) -> None:
        with self.lock:
            for secret in secrets:
                self.forms.update(form for form in (secret, repr(secret.encode())[2:-1]) if len(form) >= 4)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.forms:
            return True
        try:
            text = record.getMessage()
        except Exception:  # a record that does not format is logging's problem, not a leak
            return True
        masked = text
        for form in tuple(self.forms):
            masked = masked.replace(form, "****")
        if masked is not text and masked != text:
            record.msg, record.args = masked, ()
        return True


_LOG_FILTER = _SecretFilter()


def _protect_logs(kafka_config: KafkaClientConfig) -> None:
    """Register ``kafka_config``'s secrets with the filter on every kafka-python logger."""
    secrets = kafka_config.secrets()
    if not secrets:
        return
    _LOG_FILTER.add(secrets)
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if (name == "kafka" or name.startswith("kafka.")) and isinstance(logger, logging.Logger):
            if _LOG_FILTER not in logger.filters:
                logger.addFilter(_LOG_FILTER)


def ssl_context(kafka_config: KafkaClientConfig) -> ssl.SSLContext:
    """The TLS context of ``kafka_config``'s connections (TLS 1.2+, the chain always verified; the host
    name unless ``ssl.endpoint.identification.algorithm`` is empty); the system's CAs without
    ``ssl.ca.location``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = kafka_config.ssl_check_hostname
    context.verify_mode = ssl.CERT_REQUIRED
    source = f" ({kafka_config.source})" if kafka_config.source else ""
    if kafka_config.ssl_ca_location:
        try:
            context.load_verify_locations(cafile=kafka_config.ssl_ca_location)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigurationError(
                f"Kafka client config{source}: ssl.ca.location holds no usable CA certificate ({exc})",
            ) from None
    else:
        context.load_default_certs()
    if kafka_config.ssl_certificate_location:
        password = kafka_config.ssl_key_password.reveal() if kafka_config.ssl_key_password else ""
        try:
            # A password is always passed, so that OpenSSL never prompts on a terminal.
            context.load_cert_chain(
                kafka_config.ssl_certificate_location, kafka_config.ssl_key_location, password=password
            )
        except (ssl.SSLError, OSError) as exc:
            reason = str(getattr(exc, "reason", "") or exc)
            raise ConfigurationError(
                f"Kafka client config{source}: the client certificate and key cannot be loaded ({reason}): "
                "is ssl.key.password right, and does ssl.key.location belong to ssl.certificate.location?",
            ) from None
    return context


def kafka_settings(kafka_config: KafkaClientConfig, client_id: str) -> dict[str, Any]:
    """The kafka-python settings of ``kafka_config`` (the one mapping onto kafka-python's names)."""
    settings: dict[str, Any] = {
        "security_protocol": kafka_config.security_protocol,
        "client_id": kafka_config.client_id or client_id,
    }
    if kafka_config.uses_tls:
        settings["ssl_context"] = ssl_context(kafka_config)
        settings["ssl_check_hostname"] = kafka_config.ssl_check_hostname
    if kafka_config.uses_sasl:
        assert kafka_config.sasl_password is not None
        settings["sasl_mechanism"] = kafka_config.sasl_mechanism
        settings["sasl_plain_username"] = kafka_config.sasl_username
        settings["sasl_plain_password"] = _Masked(kafka_config.sasl_password.reveal())
    return settings


def sasl_mechanism(kafka_config: KafkaClientConfig, host: str) -> Any:
    """kafka-python's own SASL mechanism object for ``kafka_config`` (the listener check logs in with it)."""
    from kafka.net.sasl import get_sasl_mechanism  # kafka-python 3 (pinned in pyproject)

    assert kafka_config.sasl_mechanism is not None and kafka_config.sasl_password is not None
    return get_sasl_mechanism(kafka_config.sasl_mechanism)(
        host=host,
        security_protocol=kafka_config.security_protocol,
        sasl_mechanism=kafka_config.sasl_mechanism,
        sasl_plain_username=kafka_config.sasl_username,
        sasl_plain_password=_Masked(kafka_config.sasl_password.reveal()),
    )


def _build(
    factory: Callable[..., C],
    servers: Sequence[str],
    *,
    client_id: str,
    connect_timeout: float,
    kafka_config: KafkaClientConfig | None = None,
    **tuning: Any,
) -> C:
    """A connected kafka-python client made by ``factory`` (``tuning``: that client's own settings)."""
    config = resolve_kafka_config() if kafka_config is None else kafka_config
    _protect_logs(config)
    servers = list(servers)
    deadline = time.monotonic() + max(1.0, connect_timeout)
    settings = kafka_settings(config, client_id)
    check_listener(servers, config, settings.get("ssl_context"), min(deadline, time.monotonic() + PROBE_MAX_S))
    options = {
        "reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS,
        **tuning,
        **settings,
        "bootstrap_servers": servers,
        "bootstrap_timeout_ms": max(1000, int((deadline - time.monotonic()) * 1000)),
    }
    with KafkaErrors(servers, config):
        return factory(**options)


#: ``producer(servers, client_id=..., connect_timeout=..., kafka_config=..., **tuning)``: a ``KafkaProducer``.
producer = partial(_build, KafkaProducer)
#: ``consumer(servers, ...)`` likewise: a ``KafkaConsumer``.
consumer = partial(_build, KafkaConsumer)
#: ``admin(servers, ...)`` likewise: a ``KafkaAdminClient``.
admin = partial(_build, KafkaAdminClient)
