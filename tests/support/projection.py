"""Bases for test doubles that wrap a projection and change only the turn rows its views show."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from throughline.core.ports import Projection, ProjectionView


@dataclass
class PassThroughWaits:
    """The waits and change counts of ``inner``, passed through unchanged (a subclass adds ``view``)."""

    inner: Projection

    def wait_applied(self, partition: int, offset: int, timeout: float) -> bool:
        """As the inner projection."""
        return self.inner.wait_applied(partition, offset, timeout)

    def wait_settled(self, partition: int, project_sha256: bytes, offset: int, timeout: float) -> bool:
        """As the inner projection: the production scoped wait (it knows the projects of what it fetched)."""
        return self.inner.wait_settled(partition, project_sha256, offset, timeout)

    def project_changes(self, project_sha256: bytes) -> int:
        """As the inner projection."""
        return self.inner.project_changes(project_sha256)

    def wait_project_changed(self, project_sha256: bytes, seen: int, timeout: float) -> bool:
        """As the inner projection."""
        return self.inner.wait_project_changed(project_sha256, seen, timeout)


@dataclass
class PassThroughView:
    """A view's offsets, heads and sources, passed through unchanged (a subclass adds ``turns``)."""

    inner: ProjectionView

    def applied_offset(self, partition: int) -> int:
        """As the inner view."""
        return self.inner.applied_offset(partition)

    def head(self, project_sha256: bytes) -> Any:
        """As the inner view."""
        return self.inner.head(project_sha256)

    def source(self, source_sha256: bytes) -> Any:
        """As the inner view."""
        return self.inner.source(source_sha256)
