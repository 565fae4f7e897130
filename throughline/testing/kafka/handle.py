"""What every provider hands back: the :class:`KafkaHandle` protocol, the external broker, and the
registry that closes brokers still open when the interpreter exits."""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from throughline.log import PLAINTEXT, KafkaClientConfig
from throughline.testing.kafka.config import ENV_BOOTSTRAP
from throughline.testing.kafka.exceptions import HarnessError


@runtime_checkable
class KafkaHandle(Protocol):
    """What :func:`provision_kafka` returns, whichever way the broker was provisioned."""

    @property
    def provider(self) -> str:
        """``"external"``, ``"docker"`` or ``"jvm"``."""
        ...

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` for Kafka clients."""
        ...

    @property
    def supports_restart(self) -> bool:
        """Whether :meth:`restart` can stop and start the broker on the same data."""
        ...

    def describe(self) -> str:
        """One human-readable line: provider, address, where its data/logs are."""
        ...

    def restart(self, *, graceful: bool = True) -> None:
        """Stop the broker and start it again on the same data directory and ports."""
        ...

    def close(self) -> None:
        """Stop the broker (if this harness started it) and release its resources."""
        ...


class OwnedBroker:
    """A broker the harness starts itself: ``kill``, ``restart`` and ``close`` in terms of its own
    ``start`` and ``stop`` (each provider says what "keeping the data" means for it)."""

    def start(self) -> Any:
        """Start the broker (or start it again on the data a stop kept)."""
        raise NotImplementedError

    def stop(self, *, keep_data: bool = False, graceful: bool = True) -> None:
        """Stop the broker; with ``keep_data`` its data stays for :meth:`start`."""
        raise NotImplementedError

    def kill(self) -> None:
        """Crash the broker (SIGKILL), keeping its data for :meth:`start`."""
        self.stop(keep_data=True, graceful=False)

    def restart(self, *, graceful: bool = True) -> None:
        """Stop (keeping data) and start again on the same data, ports and cluster id."""
        self.stop(keep_data=True, graceful=graceful)
        self.start()

    def close(self) -> None:
        """Stop the broker and release what it holds (its container, or its work dir unless kept)."""
        self.stop(keep_data=False)


@dataclass(frozen=True)
class ExternalKafka:
    """A broker somebody else runs (``THROUGHLINE_TEST_BOOTSTRAP_SERVERS``); nothing to start or stop.

    ``kafka_config`` is how to reach it (``THROUGHLINE_KAFKA_CONFIG``'s file: a secured cluster); the
    brokers the harness starts itself speak PLAINTEXT.
    """

    bootstrap_servers: str
    provider: str = "external"
    kafka_config: KafkaClientConfig = PLAINTEXT

    @property
    def supports_restart(self) -> bool:
        return False

    def describe(self) -> str:
        return f"external broker at {self.bootstrap_servers} (from ${ENV_BOOTSTRAP}, {self.kafka_config.label()})"

    def restart(self, *, graceful: bool = True) -> None:
        raise HarnessError(f"cannot restart an external broker ({self.bootstrap_servers})")

    def close(self) -> None:
        return None


# Every broker this process started and has not closed yet; the ones still open at exit are closed then.
_LIVE: set[Any] = set()
_LIVE_LOCK = threading.Lock()


def register_live(handle: Any) -> None:
    """Remember a started broker so that it is closed at interpreter exit if nobody closed it."""
    with _LIVE_LOCK:
        _LIVE.add(handle)


def discard_live(handle: Any) -> None:
    """Forget a broker that was closed."""
    with _LIVE_LOCK:
        _LIVE.discard(handle)


@contextlib.contextmanager
def closed_on_failure(handle: Any) -> Iterator[None]:
    """Close ``handle`` when the block raises (a half-started broker or container holds ports, a
    container or a work dir), then let the error go on."""
    try:
        yield
    except BaseException:
        handle.close()
        raise


def _cleanup_at_exit() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for handle in live:
        with contextlib.suppress(Exception):
            handle.close()


atexit.register(_cleanup_at_exit)
