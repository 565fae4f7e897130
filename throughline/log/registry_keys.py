"""The client properties file's schema registry keys (``throughline.log.registry_config`` reads them)."""

from __future__ import annotations

#: The schema registry's keys (Confluent's serializer names; ``schema.registry.basic.auth.user.info`` is
#: the Java clients' prefixed spelling of ``basic.auth.user.info``).
REGISTRY_KEYS = (
    "schema.registry.url",
    "basic.auth.user.info",
    "basic.auth.credentials.source",
    "schema.registry.basic.auth.user.info",
    "schema.registry.basic.auth.credentials.source",
    "schema.registry.ssl.ca.location",
    "schema.registry.ssl.certificate.location",
    "schema.registry.ssl.key.location",
    "schema.registry.ssl.key.password",
    "schema.registry.ssl.endpoint.identification.algorithm",
)
