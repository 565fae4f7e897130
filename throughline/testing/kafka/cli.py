"""``python -m throughline.testing.kafka start|stop|status|fetch|fetch-registry``: a detached local JVM broker,
and the one-time fetches of the Kafka jars and of the tests' schema registry."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from throughline.testing.kafka.apicurio import fetch_apicurio
from throughline.testing.kafka.config import (
    ENV_BOOTSTRAP,
    ENV_CACHE,
    ENV_STATE,
    KAFKA_VERSION,
    stderr_reporter,
)
from throughline.testing.kafka.exceptions import HarnessError
from throughline.testing.kafka.jvm import BrokerSettings, KafkaBroker, pid_alive, pid_cmdline
from throughline.testing.kafka.maven import fetch_kafka_jars

_STATE_FILE = "broker.json"


@dataclass(frozen=True)
class BrokerState:
    """What the CLI records about its detached broker (``<state-dir>/broker.json``)."""

    pid: int
    bootstrap_servers: str
    work_dir: str
    port: int
    controller_port: int
    started_at: str
    kafka_version: str = KAFKA_VERSION

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> BrokerState:
        data = json.loads(text)
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def default_state_dir() -> Path:
    """``$THROUGHLINE_KAFKA_STATE`` or ``./.cache/kafka-local``."""
    configured = os.environ.get(ENV_STATE, "").strip()
    return Path(configured).expanduser() if configured else Path.cwd() / ".cache" / "kafka-local"


def _read_state(state_dir: Path) -> BrokerState | None:
    try:
        return BrokerState.from_json((state_dir / _STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _recorded(args: argparse.Namespace) -> tuple[Path, BrokerState | None]:
    """The folder ``--state-dir`` names, and the broker recorded there (``None``: none, or unreadable)."""
    state_dir = Path(args.state_dir).expanduser().resolve()
    return state_dir, _read_state(state_dir)


def _state_process_alive(state: BrokerState) -> bool:
    """The recorded pid is alive *and* is our broker (not a recycled pid)."""
    if not pid_alive(state.pid):
        return False
    cmdline = pid_cmdline(state.pid)
    return "kafka.Kafka" in cmdline and f"-Dthroughline.harness.workdir={state.work_dir}" in cmdline


def _export_lines(bootstrap: str) -> str:
    return f"export THROUGHLINE_BOOTSTRAP_SERVERS={bootstrap}\nexport {ENV_BOOTSTRAP}={bootstrap}"


def _cli_start(args: argparse.Namespace) -> int:
    state_dir, state = _recorded(args)
    if state is not None and _state_process_alive(state):
        stderr_reporter(f"already running: pid {state.pid} at {state.bootstrap_servers}")
        print(_export_lines(state.bootstrap_servers))
        return 0
    (state_dir / _STATE_FILE).unlink(missing_ok=True)
    work_dir = state_dir / "work"
    if args.fresh and work_dir.exists():
        shutil.rmtree(work_dir)
    settings = BrokerSettings(port=args.port, keep_work_dir=True)
    broker = KafkaBroker(settings=settings, work_dir=work_dir, detached=True)
    resumed = (work_dir / "data" / "meta.properties").exists()
    broker.start(timeout_s=args.timeout)
    pid = broker.pid
    assert pid is not None
    new_state = BrokerState(
        pid=pid,
        bootstrap_servers=broker.bootstrap_servers,
        work_dir=str(broker.work_dir),
        port=broker.port,
        controller_port=broker.controller_port,
        started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / _STATE_FILE).write_text(new_state.to_json(), encoding="utf-8")
    stderr_reporter(
        f"{'resumed' if resumed else 'started'} Kafka {KAFKA_VERSION} at {broker.bootstrap_servers} "
        f"(pid {pid}, {broker.last_startup_s or 0:.1f}s; logs in {broker.log_dir})"
    )
    print(_export_lines(broker.bootstrap_servers))
    return 0


def _cli_stop(args: argparse.Namespace) -> int:
    state_dir, state = _recorded(args)
    if state is None:
        stderr_reporter(f"no broker recorded in {state_dir}")
        return 0
    if _state_process_alive(state):
        broker = KafkaBroker(settings=BrokerSettings(keep_work_dir=False), work_dir=state.work_dir, detached=True)
        broker.adopt(state.pid)
        broker.stop(keep_data=args.keep_data)
        stderr_reporter(f"stopped broker pid {state.pid} ({state.bootstrap_servers})")
    else:
        stderr_reporter(f"broker pid {state.pid} was not running; clearing its state")
        if not args.keep_data:
            shutil.rmtree(state.work_dir, ignore_errors=True)
    (state_dir / _STATE_FILE).unlink(missing_ok=True)
    return 0


def _cli_status(args: argparse.Namespace) -> int:
    state_dir, state = _recorded(args)
    if state is None or not _state_process_alive(state):
        why = f"no state in {state_dir}" if state is None else f"stale state: pid {state.pid} is gone; `stop` clears it"
        print(f"not running ({why})")
        return 3
    print(
        f"running pid={state.pid} bootstrap={state.bootstrap_servers} "
        f"since={state.started_at} work_dir={state.work_dir}"
    )
    return 0


def _cli_fetch(args: argparse.Namespace) -> int:
    dist = fetch_kafka_jars(args.cache_dir, pom=args.pom)
    stderr_reporter(
        f"Kafka {dist.kafka_version} jars ready in {dist.libs_dir} ({len(dist.jars)} jars; "
        f"slf4j-api {dist.jar_version('slf4j-api')}, log4j-slf4j-impl {dist.jar_version('log4j-slf4j-impl')}, "
        f"log4j-core {dist.jar_version('log4j-core')})"
    )
    return 0


def _cli_fetch_registry(args: argparse.Namespace) -> int:
    dist = fetch_apicurio(args.cache_dir)
    stderr_reporter(f"Apicurio Registry {dist.version} ready in {dist.root} (java -jar {dist.run_jar})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m throughline.testing.kafka start|stop|status|fetch``."""
    parser = argparse.ArgumentParser(
        prog="python -m throughline.testing.kafka",
        description=f"A local Apache Kafka {KAFKA_VERSION} broker (from Maven Central jars) on 127.0.0.1.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def _with_state(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--state-dir",
            default=str(default_state_dir()),
            help=f"where the broker's state and data live (default ${ENV_STATE} or ./.cache/kafka-local)",
        )

    p_start = sub.add_parser("start", help="start a detached broker; prints `export ...` lines")
    _with_state(p_start)
    p_start.add_argument("--port", type=int, default=0, help="client port (default: a free one)")
    p_start.add_argument("--timeout", type=float, default=None, help="seconds to wait for readiness")
    p_start.add_argument("--fresh", action="store_true", help="discard data kept by `stop --keep-data`")
    p_start.set_defaults(func=_cli_start)

    p_stop = sub.add_parser("stop", help="stop the detached broker and delete its data")
    _with_state(p_stop)
    p_stop.add_argument("--keep-data", action="store_true", help="keep data; the next `start` resumes it")
    p_stop.set_defaults(func=_cli_stop)

    p_status = sub.add_parser("status", help="print whether the detached broker runs (exit 3 if not)")
    _with_state(p_status)
    p_status.set_defaults(func=_cli_status)

    p_fetch = sub.add_parser("fetch", help="only fetch the Kafka jars into the cache")
    p_fetch.add_argument("--cache-dir", default=None, help=f"default ${ENV_CACHE} or ~/.cache/throughline/...")
    p_fetch.add_argument("--pom", default=None, help="another pom.xml of Kafka jars (give it its own --cache-dir)")
    p_fetch.set_defaults(func=_cli_fetch)

    p_registry = sub.add_parser("fetch-registry", help="only fetch the tests' schema registry (Apicurio Registry)")
    p_registry.add_argument("--cache-dir", default=None, help="default $THROUGHLINE_REGISTRY_CACHE or ~/.cache/...")
    p_registry.set_defaults(func=_cli_fetch_registry)

    args = parser.parse_args(argv)
    # kafka-python logs connection refusals while a broker boots; keep the CLI quiet.
    logging.getLogger("kafka").addHandler(logging.NullHandler())
    logging.getLogger("kafka").propagate = False
    try:
        result: int = args.func(args)
    except HarnessError as exc:
        stderr_reporter(f"error: {exc}")
        return 1
    return result
