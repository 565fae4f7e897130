"""Ports, addresses, KRaft cluster ids and bounded tool runs: the small helpers every broker provider uses."""

from __future__ import annotations

import base64
import socket
import subprocess
import uuid
from pathlib import Path

from throughline.testing.kafka.config import LOOPBACK
from throughline.testing.kafka.exceptions import HarnessError


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port that is free on ``host`` right now (the OS picks it)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct TCP ports that are free on ``host`` right now."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def tcp_open(host: str, port: int, timeout_s: float) -> bool:
    """Whether a TCP connection to ``host:port`` is accepted within ``timeout_s``."""
    try:
        with socket.create_connection((host, port), timeout=max(0.05, timeout_s)):
            return True
    except OSError:
        return False


def split_bootstrap(bootstrap_servers: str) -> tuple[str, int]:
    """(host, port) of the first address in a ``host:port[,...]`` list."""
    first = bootstrap_servers.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    if not host or not port.isdigit():
        raise HarnessError(f"bootstrap servers {bootstrap_servers!r} are not host:port")
    return host.strip("[]"), int(port)


def random_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, base64url without padding (like ``random-uuid``)."""
    for _ in range(100):
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        # Kafka's own generator avoids ids starting with '-' (they read as command-line flags).
        if not cid.startswith("-"):
            return cid
    raise HarnessError("could not generate a cluster id")  # pragma: no cover


def run_tool(
    cmd: list[str], *, cwd: Path, timeout_s: float, what: str, error: type[HarnessError] = HarnessError
) -> subprocess.CompletedProcess[bytes]:
    """Run a harness tool (``mvn``, Kafka's StorageTool, ``openssl``) to its end, bounded by ``timeout_s``:
    no stdin, output captured, its exit code left to the caller. ``error`` (naming ``what``) when it
    cannot start or does not finish in time."""
    try:
        return subprocess.run(
            cmd, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise error(f"{what} did not finish within {timeout_s:.0f}s") from exc
    except OSError as exc:
        raise error(f"could not run {cmd[0]} ({what}): {exc}") from exc
