"""The worked example of docs/hosts.md: a host adapter in a distribution of its own
(examples/host-adapter), installed into a fresh virtual environment beside throughline (``pip install -e``
of the checkout and of the example; packages come from PyPI or pip's cache), adds ``--format toychat``
and ``hook toychat`` without any change to throughline, and its sessions go through a real broker."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import venv
from pathlib import Path

from support.topic import read_topic
from test_hosts import chains

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "host-adapter"
INSTALL_TIMEOUT_S = 900.0
RUN_TIMEOUT_S = 120.0


def run(
    argv: list[str], env: dict[str, str], stdin: str | None = None, timeout: float = RUN_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, input=stdin, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def test_an_adapter_installed_from_its_own_distribution_ingests_and_hooks_through_a_broker(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    base = run([python, "-m", "pip", "install", "-q", "-e", str(ROOT)], env, timeout=INSTALL_TIMEOUT_S)
    assert base.returncode == 0, base.stderr
    cli = str(env_dir / "bin" / "throughline")
    before = run([cli, "ingest", "--help"], env)
    assert "toychat" not in before.stdout  # throughline alone does not know the host
    plugin = run([python, "-m", "pip", "install", "-q", "-e", f"{EXAMPLE}[test]"], env, timeout=INSTALL_TIMEOUT_S)
    assert plugin.returncode == 0, plugin.stderr
    assert "toychat" in run([cli, "ingest", "--help"], env).stdout
    # the adapter's own suite runs throughline's conformance kit in that environment
    kit = run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLE / "tests")],
        env,
        timeout=INSTALL_TIMEOUT_S,
    )
    assert kit.returncode == 0, kit.stdout + kit.stderr
    assert "passed" in kit.stdout and "failed" not in kit.stdout

    home = tmp_path / "toychat"
    (home / "sessions").mkdir(parents=True)
    shutil.copy(EXAMPLE / "tests" / "fixtures" / "s1.jsonl", home / "sessions" / "s1.jsonl")
    env.update(
        THROUGHLINE_BOOTSTRAP_SERVERS=kafka_bootstrap,
        THROUGHLINE_TOPIC=kafka_topic_name,
        TOYCHAT_HOME=str(home),
    )
    env.pop("THROUGHLINE_DB", None)
    ingested = run([cli, "ingest", "--format", "toychat"], env)  # the adapter's default root
    assert ingested.returncode == 0, ingested.stderr
    records = read_topic(kafka_bootstrap, kafka_topic_name)
    assert sorted((r.turn.turn_id, r.turn.seq) for r in records) == [("p-1", 1), ("p-2", 2), ("p-3", 3)]
    assert {r.turn.host for r in records} == {"toychat"}

    # the host's stop hook: the open turn (p-4, after a rewind to p-2) is final now
    payload = json.dumps({"transcript_path": str(home / "sessions" / "s1.jsonl"), "session_id": "s1"})
    hooked = run(["sh", "-c", f"{cli} hook toychat --wait 0.2 --state-dir {tmp_path / 'hooks'}"], env, stdin=payload)
    assert (hooked.returncode, hooked.stdout) == (0, ""), hooked.stderr
    records = read_topic(kafka_bootstrap, kafka_topic_name)
    seqs = {r.turn.turn_id: r.turn.seq for r in records}
    assert set(seqs) <= {"p-1", "p-2", "p-3", "p-4"} and seqs.get("p-4", 2) == 2
    # the hook sends what the parser completes (p-4 once the hook settles the file), each turn once in the chain
    assert list(chains(records).values()) in ([["p-1", "p-2", "p-3"]], [["p-1", "p-4"]])
