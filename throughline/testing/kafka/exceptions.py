"""The Kafka test harness's errors: one root, :class:`HarnessError`, and a class per way to fail."""

from __future__ import annotations


class HarnessError(RuntimeError):
    """Root of every error raised by the Kafka test harness."""


class MavenFetchError(HarnessError):
    """Fetching the Kafka jars from Maven Central failed (or ``mvn`` is missing)."""


class JavaNotFoundError(HarnessError):
    """No ``java`` executable (Java 17+) was found."""


class BrokerStartError(HarnessError):
    """A broker did not become ready: it exited, timed out, or could not be configured."""


class DockerUnavailableError(HarnessError):
    """The docker provider was forced, but no Docker engine answered."""
