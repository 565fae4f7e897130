"""The OpenAPI document says what the server does: Schemathesis, every check, against a real ``serve``.

Schemathesis runs from its own pinned environment (its dependencies are not the product's), built on
first use in ``~/.cache/throughline/schemathesis-<version>`` from PyPI (or the one named by
``THROUGHLINE_SCHEMATHESIS``, an executable). The one allowance it is given is in
tests/schemathesis/schemathesis.toml, with the reason. Also here, without Schemathesis: the served
document is the committed docs/openapi.json, and what the issue found wrong stays right (an empty
project is refused by the schema; the aliases are not parameters beside their long names; a 405
names every method of the path).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

from test_serve import KEY_HEX, PROJECT, Serve, produce, turn

from throughline.serve.tokens import generate_key_file, issue_token, load_signing_key

SCHEMATHESIS_VERSION = "4.32.5"
ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "schemathesis" / "schemathesis.toml"
ADMIN = "admin-token-for-schemathesis-0123456"


def schemathesis() -> Path:
    """The pinned Schemathesis executable (built once into the cache)."""
    named = os.environ.get("THROUGHLINE_SCHEMATHESIS")
    if named:
        return Path(named)
    env = Path.home() / ".cache" / "throughline" / f"schemathesis-{SCHEMATHESIS_VERSION}"
    exe = env / "bin" / "schemathesis"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=300)
        subprocess.run(
            [
                str(env / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                f"schemathesis=={SCHEMATHESIS_VERSION}",
            ],
            check=True,
            timeout=900,
        )
    return exe


def test_schemathesis_finds_the_document_and_the_server_agree(
    kafka_bootstrap: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    produce(kafka_bootstrap, kafka_topic_name, [turn(n, seq=n) for n in range(1, 4)])
    generate_key_file(tmp_path / "k.json", public_out=tmp_path / "k.pub")
    scoped_admin = issue_token(load_signing_key(tmp_path / "k.json"), scope="admin", expires_in=3600)
    serve = Serve(
        kafka_bootstrap,
        kafka_topic_name,
        tmp_path / "p.duckdb",
        "--token-keys", str(tmp_path / "k.pub"), "--max-wait", "0.5", "--read-wait", "0.2",
        env={"THROUGHLINE_AUTH_TOKEN": ADMIN, "THROUGHLINE_TOKEN_KEY": KEY_HEX},
    )  # fmt: skip
    exe = schemathesis()
    serve.start()
    try:
        status, _, served = serve.request("GET", "/openapi.json")
        assert status == 200
        document = json.loads(served)
        assert document == json.loads((ROOT / "docs" / "openapi.json").read_text("utf-8"))
        assert document["components"]["securitySchemes"]["bearerToken"]["scheme"] == "bearer"
        read = document["paths"]["/v1/projects/read"]
        names = [p["name"] for p in read["get"]["parameters"]]
        assert "after" not in names and "through" not in names
        assert {"401", "403"} <= set(read["get"]["responses"]) and {"401", "403"} <= set(read["post"]["responses"])
        project = next(p for p in read["get"]["parameters"] if p["name"] == "project")
        assert project["schema"]["minLength"] == 1
        status, headers, _ = serve.request("PUT", "/v1/projects/read", token=ADMIN)
        assert status == 405 and headers["allow"] == "GET, POST"
        status, _, _ = serve.request(
            "GET", "/v1/projects/read?" + urllib.parse.urlencode({"project": PROJECT}), token=scoped_admin
        )
        assert status == 200
        ran = subprocess.run(
            [
                str(exe), "--config-file", str(CONFIG), "run", f"{serve.url}/openapi.json",
                "--checks", "all", "--header", f"Authorization: Bearer {scoped_admin}",
                "--max-examples", os.environ.get("THROUGHLINE_SCHEMATHESIS_EXAMPLES", "40"), "--generation-deterministic", "--request-timeout", "20",
                "--wait-for-schema", "20",
            ],
            capture_output=True, text=True, timeout=900, cwd=tmp_path,
            env={**os.environ, "NO_COLOR": "1", "SCHEMATHESIS_HOOKS": ""},
        )  # fmt: skip
        assert ran.returncode == 0, ran.stdout[-6000:] + ran.stderr[-2000:]
        assert serve.proc is not None and serve.proc.poll() is None, serve.stderr()
    finally:
        serve.kill()
