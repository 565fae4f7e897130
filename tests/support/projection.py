"""Bases for test doubles that wrap a projection and change only the turn rows its views show."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from throughline.core.ports import Projection, ProjectionView, QuarantineReport, StoredTurn, T, turns_each


@dataclass
class PassThroughWaits:
    """The waits, change counts and offsets of ``inner``, passed through unchanged (a subclass adds ``view``;
    ``read`` answers in that ``view``, so every page reads through the subclass's doctored views)."""

    inner: Projection

    def view(self) -> AbstractContextManager[ProjectionView]:
        """What the subclass shows."""
        raise NotImplementedError

    def read(self, answer: Callable[[ProjectionView], T]) -> T:
        """``answer`` of the subclass's ``view`` (never overtaken: it reads in a snapshot)."""
        with self.view() as view:
            return answer(view)

    def readable_offsets(self) -> Mapping[int, int]:
        """As the inner projection."""
        return self.inner.readable_offsets()

    def committed_offsets(self) -> Mapping[int, int] | None:
        """As the inner projection."""
        return self.inner.committed_offsets()

    def quarantine(self, project_sha256: bytes | None = None, *, times: bool = True) -> QuarantineReport | None:
        """As the inner projection."""
        return self.inner.quarantine(project_sha256, times=times)

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

    def turns(self, source_sha256: bytes, first_seq: int, last_seq: int) -> list[StoredTurn]:
        """What the subclass shows."""
        raise NotImplementedError

    def turns_many(self, ranges: Sequence[tuple[bytes, int, int]]) -> list[list[StoredTurn]]:
        """The subclass's ``turns``, range by range."""
        return turns_each(self, ranges)
