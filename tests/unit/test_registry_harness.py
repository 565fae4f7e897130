"""The tests' schema registry harness (``throughline.testing.kafka.apicurio``) without starting it: which
``java`` runs Apicurio Registry (it needs Java 21+, the brokers run on 17), and when a cached server
counts as fetched. Starting it is the integration tier's (``integration/test_schema_registry.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from throughline.testing.kafka import apicurio
from throughline.testing.kafka.exceptions import JavaNotFoundError


def _java_home(root: Path, name: str, version: str) -> Path:
    home = root / name
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text("#!/bin/sh\n", "utf-8")
    java.chmod(0o755)
    (home / "release").write_text(f'IMPLEMENTOR="test"\nJAVA_VERSION="{version}"\n', "utf-8")
    return home


@pytest.fixture
def no_system_java(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the homes a test names: no ``java`` on PATH, nothing under /usr/lib/jvm."""
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.delenv(apicurio.ENV_REGISTRY_JAVA_HOME, raising=False)
    monkeypatch.setattr(apicurio.glob, "glob", lambda pattern: [])


def test_the_first_java_21_or_newer_runs_the_registry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_system_java: None
) -> None:
    old = _java_home(tmp_path, "jdk-17", "17.0.15")
    new = _java_home(tmp_path, "jdk-25", "25.0.3")
    monkeypatch.setenv(apicurio.ENV_REGISTRY_JAVA_HOME, str(old))
    monkeypatch.setenv("JAVA_HOME", str(new))
    assert apicurio.find_registry_java() == str(new / "bin" / "java")
    monkeypatch.setenv(apicurio.ENV_REGISTRY_JAVA_HOME, str(_java_home(tmp_path, "jdk-21", "21.0.1")))
    assert apicurio.find_registry_java() == str(tmp_path / "jdk-21" / "bin" / "java")


def test_without_a_java_21_the_error_says_what_it_looked_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_system_java: None
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(_java_home(tmp_path, "jdk-17", "17.0.15")))
    with pytest.raises(JavaNotFoundError, match=r"needs Java 21\+") as info:
        apicurio.find_registry_java()
    assert "jdk-17 (17)" in str(info.value)
    assert apicurio.ENV_REGISTRY_JAVA_HOME in str(info.value)


def test_a_cached_server_counts_only_with_its_marker_and_launcher(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    assert apicurio._load(tmp_path) is None  # nothing unpacked yet
    (tmp_path / "app" / "quarkus-run.jar").write_bytes(b"PK")
    assert apicurio._load(tmp_path) is None  # unpacked, but the fetch did not finish
    marker = tmp_path / ".complete.json"
    marker.write_text(json.dumps({"artifact": "io.apicurio:apicurio-registry-app:3.0.9:tar.gz:all"}), "utf-8")
    assert apicurio._load(tmp_path) is None  # another version's
    marker.write_text(json.dumps({"artifact": apicurio.APICURIO_ARTIFACT}), "utf-8")
    found = apicurio._load(tmp_path)
    assert found is not None and found.run_jar == tmp_path / "app" / "quarkus-run.jar"
