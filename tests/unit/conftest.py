"""Fixtures of the unit tier: an empty DuckDB projection for the store tests, and the three-turn world
the HTTP tests serve (``read_api`` serves it over a real loopback socket)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from projector_histories import TOPIC
from reader_world import World
from served_app import ApiSettings, ServedApp

from throughline.projector.store import DuckProjection


@pytest.fixture
def db(tmp_path: Path) -> Iterator[DuckProjection]:
    """A new, empty projection bound to ``projector_histories.TOPIC``, closed after the test."""
    with DuckProjection.open(tmp_path / "p.duckdb", topic=TOPIC) as projection:
        yield projection


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
