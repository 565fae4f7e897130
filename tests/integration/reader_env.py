"""A project on the real broker, its DuckDB projection in a tmp folder, and the CLI to drive them.

Not a test module: imported by ``test_reader_*.py``. Commands run in-process through
``throughline.cli.main`` (stdout and stderr captured) unless a test needs a real process.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from throughline.cli import main
from throughline.reader import ObserverRead

BASE = "2026-07-15T09:00:00"


@dataclass
class Env:
    """One topic, one projection file, one project (with a raw name that must never leak)."""

    bootstrap: str
    topic: str
    tmp: Path
    project: str = "/srv/secret-workspace/ledger-αβ"
    counter: int = 0
    db: Path = field(init=False)

    def __post_init__(self) -> None:
        (self.tmp / "proj").mkdir(exist_ok=True)
        self.db = self.tmp / "proj" / "throughline.duckdb"

    @classmethod
    def isolated(cls, bootstrap: str, topic: str, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
        """An Env that sees none of the developer's token key or broker settings."""
        for name in ("THROUGHLINE_TOKEN_KEY", "THROUGHLINE_TOKEN_KEY_FILE", "THROUGHLINE_BOOTSTRAP_SERVERS"):
            monkeypatch.delenv(name, raising=False)
        return cls(bootstrap, topic, tmp)

    @property
    def connection(self) -> list[str]:
        return ["--bootstrap-servers", self.bootstrap, "--topic", self.topic, "--db", str(self.db)]

    def cli(self, *argv: str) -> tuple[int, str, str]:
        """Run ``throughline ARGV`` in this process; returns (exit code, stdout, stderr)."""
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except SystemExit as exc:  # argparse usage errors
                code = int(exc.code or 0)
        return code, out.getvalue(), err.getvalue()

    def process(self, *argv: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run ``throughline ARGV`` as a real process."""
        return subprocess.run(
            [sys.executable, "-m", "throughline.cli", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=clean_env(),
            check=False,
        )

    def turn(self, *, host: str = "host-secret-1", thread: str = "thread-secret-A", seq: int | None = None) -> dict:
        """A new turn line (unique id and body)."""
        self.counter += 1
        line: dict[str, Any] = {
            "project": self.project,
            "host": host,
            "thread": thread,
            "turnId": f"turnid-secret-{self.counter}",
            "completedAt": f"{BASE}.{self.counter:06d}Z",
            "body": f"body-secret-{self.counter} ✓",
        }
        if seq is not None:
            line["seq"] = seq
        return line

    def ingest(self, lines: list[dict]) -> None:
        """``throughline ingest FILE``."""
        path = self.tmp / f"turns-{self.counter}.jsonl"
        path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
        code, out, err = self.cli("ingest", str(path), "--partitions", "3", *self.connection)
        assert code == 0, err

    def ingest_n(self, n: int, **kwargs: Any) -> list[dict]:
        lines = [self.turn(**kwargs) for _ in range(n)]
        self.ingest(lines)
        return lines

    def project_log(self) -> None:
        """``throughline project --until-caught-up``."""
        code, out, err = self.cli("project", "--until-caught-up", *self.connection)
        assert code == 0, err

    def read(
        self,
        *,
        after: str | None = None,
        through: str | None = None,
        token: str | None = None,
        limit: int | None = None,
        extra: tuple[str, ...] = (),
    ) -> tuple[ObserverRead, str]:
        """``throughline read``; returns the parsed document and its exact stdout."""
        argv = ["read", "--project", self.project, *self.connection, "--wait", "0", *extra]
        if after is not None:
            argv += ["--after", after]
        if through is not None:
            argv += ["--through", through]
        if token is not None:
            argv += ["--page-token", token]
        if limit is not None:
            argv += ["--limit", str(limit)]
        code, out, err = self.cli(*argv)
        assert code == 0, err
        assert out.count("\n") == 1  # exactly one document
        return ObserverRead.from_json(out), out

    def read_error(self, *argv: str) -> tuple[int, str]:
        """A ``throughline read`` that must fail; returns (exit code, error code)."""
        code, out, err = self.cli("read", "--project", self.project, *self.connection, "--wait", "0", *argv)
        assert out == ""
        doc = json.loads([line for line in err.splitlines() if line.startswith("{")][-1])
        return code, doc["error"]["code"]


def clean_env() -> dict[str, str]:
    """The environment for child processes, without throughline settings a developer may have set."""
    return {k: v for k, v in os.environ.items() if not k.startswith("THROUGHLINE_")}
