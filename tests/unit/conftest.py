"""Fixtures of the HTTP client tests: the read API served over a real loopback socket."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from reader_world import World
from served_app import ApiSettings, ServedApp


@pytest.fixture
def http_world() -> World:
    """A projection and log with three turns of ``reader_world.PROJECT``."""
    world = World()
    world.append_many(3)
    return world


@pytest.fixture
def read_api(http_world: World) -> Iterator[ServedApp]:
    """The read API over ``http_world`` (no bounded wait, no auth token)."""
    with ServedApp(http_world, ApiSettings(read_wait=0.0)) as served:
        yield served
