"""compose.yaml for real: build the project's image, run the broker and serve, audit with the demo's Observer.

``docker compose`` (or Debian's ``docker-compose``, as scripts/test-docker finds it:
``THROUGHLINE_COMPOSE_CMD``) brings up compose.yaml with compose.host.yaml (the tier's engine has no
bridge: both services on the host network, 127.0.0.1 only, on free ports), building the project's image
from its Dockerfile on ``THROUGHLINE_PYTHON_IMAGE``. The sample turns are ingested from this machine,
and the Observer of ``scripts/demo`` audits every project through serve's HTTP API with the bearer
token; the stack is taken down with its volumes whatever happens.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib.machinery import SourceFileLoader
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from throughline.testing.kafka.support import free_ports

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "examples" / "turns.jsonl"
UP_TIMEOUT_S = 1200.0  # a cold build installs the package's wheels from PyPI
HEALTHY_TIMEOUT_S = 240.0


def _demo() -> ModuleType:
    """scripts/demo as a module (an extensionless file needs an explicit loader)."""
    loader = SourceFileLoader("throughline_demo", str(REPO / "scripts" / "demo"))
    spec = importlib.util.spec_from_loader("throughline_demo", loader)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("throughline_demo", module)
    spec.loader.exec_module(module)
    return module


def _merge(base: Any, override: Any) -> Any:
    """Compose's merge of two files, for what these two hold: maps merge key by key, the rest is replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = _merge(base[key], value) if key in base else value
        return merged
    return override


def host_network_file(folder: Path) -> Path:
    """compose.yaml with compose.host.yaml applied, as one file.

    Compose merges ``ports:`` lists instead of replacing them, and docker-py (under Debian's
    docker-compose 1.29) refuses published ports on the host network, so the services that
    compose.host.yaml puts there lose compose.yaml's ``ports:`` (they would mean nothing there).
    """
    base = yaml.safe_load((REPO / "compose.yaml").read_text(encoding="utf-8"))
    override = yaml.safe_load((REPO / "compose.host.yaml").read_text(encoding="utf-8"))
    merged = _merge(base, override)
    for service in merged["services"].values():
        if service.get("network_mode") == "host":
            service.pop("ports", None)
        if isinstance(service.get("build"), dict):
            service["build"]["context"] = str(REPO)
    path = folder / "compose.host-network.yaml"
    path.write_text(yaml.safe_dump(merged, sort_keys=False), encoding="utf-8")
    return path


class Stack:
    """The compose project: ``compose -p P -f <compose.yaml + compose.host.yaml> ...`` (bounded)."""

    def __init__(self, project: str, env: dict[str, str], compose_file: Path) -> None:
        self.command = shlex.split(os.environ.get("THROUGHLINE_COMPOSE_CMD", "docker compose"))
        self.project = project
        self.env = env
        self.compose_file = compose_file

    def run(self, *args: str, timeout: float = 300.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [
            *self.command,
            "-p",
            self.project,
            "--project-directory",
            str(REPO),
            "-f",
            str(self.compose_file),
            *args,
        ]
        done = subprocess.run(
            argv, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"`{' '.join(argv)}` exited {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}")
        return done

    def container(self, service: str) -> str:
        return self.run("ps", "-q", service).stdout.strip()

    def health(self, service: str) -> str:
        cid = self.container(service)
        if not cid:
            return "missing"
        done = subprocess.run(
            [
                "docker",
                "inspect",
                "--format",
                "{{.State.Status}}/{{if .State.Health}}{{.State.Health.Status}}{{end}}",
                cid,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=self.env,
        )
        return done.stdout.strip() or done.stderr.strip()

    def logs(self) -> str:
        return self.run("logs", "--no-color", "--tail", "60", check=False).stdout[-6000:]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Stack, dict[str, int]]]:
    kafka_port, internal_port, controller_port, serve_port = free_ports(4)
    ports = {"kafka": kafka_port, "serve": serve_port}
    env = {
        **os.environ,
        "THROUGHLINE_COMPOSE_KAFKA_PORT": str(kafka_port),
        "THROUGHLINE_COMPOSE_KAFKA_INTERNAL_PORT": str(internal_port),
        "THROUGHLINE_COMPOSE_CONTROLLER_PORT": str(controller_port),
        "THROUGHLINE_COMPOSE_SERVE_PORT": str(serve_port),
        "THROUGHLINE_AUTH_TOKEN": secrets.token_urlsafe(24),
        # Its own tag, so that compose's build does not retag the labelled throughline:local.
        "THROUGHLINE_IMAGE": "throughline-compose:test",
    }
    project = os.environ.get("THROUGHLINE_COMPOSE_PROJECT", f"tl-test-{os.getpid()}")
    s = Stack(project, env, host_network_file(tmp_path))
    try:
        yield s, ports
    finally:
        s.run("down", "-v", "--remove-orphans", timeout=180, check=False)


def _wait_healthy(s: Stack, services: tuple[str, ...]) -> None:
    deadline = time.monotonic() + HEALTHY_TIMEOUT_S
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = {svc: s.health(svc) for svc in services}
        if all(state == "running/healthy" for state in states.values()):
            return
        if any(state.startswith(("exited", "dead")) for state in states.values()):
            break
        time.sleep(2)
    raise AssertionError(f"compose services not healthy: {states}\n{s.logs()}")


def test_compose_builds_runs_and_the_demo_observer_audits_through_it(
    stack: tuple[Stack, dict[str, int]], tmp_path: Path
) -> None:
    s, ports = stack
    env = s.env
    kafka_image = os.environ["THROUGHLINE_KAFKA_IMAGE"]
    python_image = os.environ["THROUGHLINE_PYTHON_IMAGE"]
    s.run("build", timeout=UP_TIMEOUT_S)
    s.run("up", "-d", timeout=UP_TIMEOUT_S)
    _wait_healthy(s, ("kafka", "throughline"))

    # The images compose ran: the chosen Kafka image, and the project's Dockerfile on the chosen Python.
    kafka_cid, serve_cid = s.container("kafka"), s.container("throughline")
    inspect = json.loads(
        subprocess.run(
            ["docker", "inspect", kafka_cid, serve_cid], capture_output=True, text=True, timeout=60, check=True, env=env
        ).stdout
    )
    assert inspect[0]["Config"]["Image"] == kafka_image
    assert inspect[1]["Config"]["Image"] == "throughline-compose:test"
    assert all(c["HostConfig"]["NetworkMode"] == "host" for c in inspect)
    base_id = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", python_image],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    ).stdout.strip()
    layers = subprocess.run(
        ["docker", "history", "-q", "--no-trunc", "throughline-compose:test"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    ).stdout.split()
    assert base_id in layers, f"throughline-compose:test is not built on {python_image}"

    # Turns from this machine into the compose broker, then the demo's Observer against compose's serve.
    demo = _demo()
    bootstrap = f"127.0.0.1:{ports['kafka']}"
    url = f"http://127.0.0.1:{ports['serve']}"
    tool_env = {k: v for k, v in env.items() if not k.startswith("THROUGHLINE_") or k == "THROUGHLINE_AUTH_TOKEN"}
    tool_env.update({"THROUGHLINE_BOOTSTRAP_SERVERS": bootstrap, "THROUGHLINE_TOPIC": "throughline.turns"})
    sample = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines() if line.strip()]
    ingest = subprocess.run(
        [demo.THROUGHLINE, "ingest", str(SAMPLE)],
        env=tool_env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ingest.returncode == 0, ingest.stderr[-3000:]
    report = demo.wait_projected(url, len(sample))
    assert report["lag"] == 0

    (tmp_path / "audit.py").write_text(demo.AUDIT, encoding="utf-8")
    projects = list(dict.fromkeys(t["project"] for t in sample))
    results = [demo.observe(p, i, url, tmp_path, tool_env) for i, p in enumerate(projects)]
    for project, result in zip(projects, results, strict=True):
        assert result["kind"] == "snapshot", (project, result)
        assert 0 < result["audited"] <= 10 and result["saved"], (project, result)
        assert result["seqs"] == sorted(result["seqs"]), result

    # A second pass is an empty delta: the saved cursors hold.
    again = [demo.observe(p, i, url, tmp_path, tool_env) for i, p in enumerate(projects)]
    assert all(r["audited"] == 0 for r in again), again
