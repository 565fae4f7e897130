"""The schema registry's settings in the client properties file (``schema.registry.url``,
``basic.auth.user.info``, ``schema.registry.ssl.*``), checked like the Kafka keys: every key used or
refused with a ``ConfigurationError`` naming it, never a secret in a message."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from throughline.log.config import _pem_file, _refuse
from throughline.log.registry_keys import REGISTRY_KEYS
from throughline.schemas.registry import RegistrySettings


def registry_from_properties(props: dict[str, str], base: Path | None, source: str | None) -> RegistrySettings | None:
    """Take the ``schema.registry.*`` / ``basic.auth.*`` keys out of ``props``; their settings, or ``None``."""
    for short in ("basic.auth.user.info", "basic.auth.credentials.source"):
        prefixed = "schema.registry." + short
        if prefixed in props:
            if short in props:
                raise _refuse(f"{short} and {prefixed} are both set; keep one", source)
            props[short] = props.pop(prefixed)
    taken = {k: props.pop(k) for k in REGISTRY_KEYS if k in props}
    url = taken.pop("schema.registry.url", "").strip()
    if not url:
        if taken:
            raise _refuse(f"{sorted(taken)[0]} is set without schema.registry.url", source)
        return None
    return registry_settings(url, taken, base, source)


def registry_settings(
    url: str, props: Mapping[str, str] | None = None, base: Path | None = None, source: str | None = None
) -> RegistrySettings:
    """Check a registry URL (and its ``basic.auth.*`` / ``schema.registry.ssl.*`` properties)."""
    props = dict(props or {})
    if "," in url:
        raise _refuse("schema.registry.url: give one registry URL (a list of URLs is not supported)", source)
    if not re.match(r"^https?://[^/\s]+", url, re.IGNORECASE):
        raise _refuse("schema.registry.url must be an http:// or https:// URL", source)
    if "@" in url.split("/", 3)[2]:
        raise _refuse("schema.registry.url must not carry credentials; use basic.auth.user.info", source)
    credentials = props.get("basic.auth.credentials.source", "USER_INFO").strip().upper()
    if credentials != "USER_INFO":
        raise _refuse("basic.auth.credentials.source: only USER_INFO is supported", source)
    user_info = props.get("basic.auth.user.info")
    if user_info is not None and ":" not in user_info:
        raise _refuse("basic.auth.user.info must be `user:password`", source)
    tls = {k.removeprefix("schema.registry.ssl."): v for k, v in props.items() if k.startswith("schema.registry.ssl.")}
    if tls and not url.lower().startswith("https://"):
        raise _refuse("schema.registry.ssl.* is set but schema.registry.url is not https://", source)
    check = True
    if "endpoint.identification.algorithm" in tls:
        algorithm = tls["endpoint.identification.algorithm"].strip().lower()
        if algorithm not in ("https", "", "none"):
            raise _refuse("schema.registry.ssl.endpoint.identification.algorithm must be `https` or empty", source)
        check = algorithm == "https"
    files: dict[str, str | None] = {}
    for name, want in (
        ("ca.location", "CERTIFICATE"),
        ("certificate.location", "CERTIFICATE"),
        ("key.location", "PRIVATE KEY"),
    ):
        files[name] = (
            _pem_file(f"schema.registry.ssl.{name}", tls[name], base, source, want=want) if name in tls else None
        )
    if (files["certificate.location"] is None) != (files["key.location"] is None):
        raise _refuse("schema.registry.ssl.certificate.location and .key.location go together", source)
    if "key.password" in tls and files["key.location"] is None:
        raise _refuse("schema.registry.ssl.key.password is set without schema.registry.ssl.key.location", source)
    return RegistrySettings(
        url=url,
        user_info=user_info,
        ca_location=files["ca.location"],
        certificate_location=files["certificate.location"],
        key_location=files["key.location"],
        key_password=tls.get("key.password"),
        check_hostname=check,
    )
