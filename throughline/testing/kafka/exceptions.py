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


class RegistryStartError(HarnessError):
    """The tests' schema registry (Apicurio Registry) did not become ready: it exited or timed out."""


class DockerUnavailableError(HarnessError):
    """The docker provider cannot run a broker: no engine answered, or the image could not be pulled or started.

    Under ``auto`` the harness falls back to the JVM broker (saying why, once); with the docker
    provider forced it raises this, with the reason.
    """
