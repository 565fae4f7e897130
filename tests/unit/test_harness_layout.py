"""The Kafka harness is a package of one-concern modules, and its public names and data stay where users look."""

from __future__ import annotations

import importlib
import importlib.resources
import subprocess
import sys
from pathlib import Path

import throughline.testing
import throughline.testing.kafka as harness

PACKAGE_DIR = Path(harness.__file__).resolve().parent


def test_every_public_name_resolves_from_both_entry_points() -> None:
    for name in harness.__all__:
        assert getattr(harness, name) is not None, name
    from throughline.testing.containers import ThroughlineContainer

    for name in throughline.testing.__all__:
        owner = ThroughlineContainer if name == "ThroughlineContainer" else getattr(harness, name)
        assert getattr(throughline.testing, name) is owner, name


def test_package_data_ships_beside_the_modules() -> None:
    files = importlib.resources.files("throughline.testing.kafka")
    for name in ("pom.xml", "log4j2.xml", "kafka-server-template.properties"):
        assert files.joinpath(name).is_file(), name
    assert "<artifactId>kafka_2.13</artifactId>" in files.joinpath("pom.xml").read_text("utf-8")


def test_no_module_of_the_harness_is_over_600_lines() -> None:
    sizes = {p.name: len(p.read_text("utf-8").splitlines()) for p in PACKAGE_DIR.glob("*.py")}
    assert {"maven.py", "jvm.py", "docker.py", "provision.py", "handle.py", "cli.py"} <= set(sizes)
    assert max(sizes.values()) <= 600, sizes


def test_modules_import_on_their_own() -> None:
    for path in sorted(PACKAGE_DIR.glob("*.py")):
        if path.stem != "__main__":
            importlib.import_module(f"throughline.testing.kafka.{path.stem}")


def test_python_dash_m_still_runs_the_command_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "throughline.testing.kafka", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    for command in ("start", "stop", "status", "fetch"):
        assert command in proc.stdout
