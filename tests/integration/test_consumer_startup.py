"""How a projector's fetch starts, against the real broker: the consumer's metadata refreshes follow its
own retry backoff (a seam into kafka-python's private cluster metadata, pinned here), and the fetcher's
first polls are small and double up to ``max_poll_records``, so the first commit does not wait for a
whole poll to be fetched and prepared."""

from __future__ import annotations

import os
import random

import pytest
from projector_env import history as make_history
from projector_env import produce_all

import throughline.projector.feed.poller as poller
from throughline.log import KafkaLog
from throughline.log.consumer import RETRY_BACKOFF_MS, prompt_metadata
from throughline.projector.feed import FeedSpec, ProjectorOptions, open_consumer
from throughline.testing import create_topic

PARTITIONS = 3
TURNS = 600


@pytest.fixture(scope="module")
def filled_topic(kafka_bootstrap: str) -> str:
    topic = f"startup-{os.getpid()}-{random.randrange(1 << 30)}"
    create_topic(kafka_bootstrap, topic, partitions=PARTITIONS)
    produce_all(kafka_bootstrap, topic, PARTITIONS, make_history(random.Random(5), TURNS, projects=6))
    return topic


def test_the_projector_consumer_refreshes_metadata_with_its_own_backoff(
    kafka_bootstrap: str, filled_topic: str
) -> None:
    consumer = open_consumer(FeedSpec((kafka_bootstrap,), filled_topic, PARTITIONS, (), ProjectorOptions()))
    try:
        # The pinned kafka-python has the shape the seam was written against: both waits are ours.
        assert consumer.prompt_metadata is True
        inner = consumer._consumer  # the seam under test
        assert inner.config["retry_backoff_ms"] == RETRY_BACKOFF_MS
        assert inner._cluster.config["retry_backoff_ms"] == RETRY_BACKOFF_MS
    finally:
        consumer.close()
    assert prompt_metadata(object()) is False  # another shape: left alone, and said so


def test_the_log_view_refreshes_metadata_with_the_same_backoff(kafka_bootstrap: str, filled_topic: str) -> None:
    # Its partition count waits for a metadata refresh: at kafka-python's 100 ms that was most of the
    # ~115 ms every projector run spent opening its log view.
    with KafkaLog([kafka_bootstrap], filled_topic, timeout=10.0) as view:
        inner = view._consumer  # the seam under test
        assert inner.config["retry_backoff_ms"] == RETRY_BACKOFF_MS
        assert inner._cluster.config["retry_backoff_ms"] == RETRY_BACKOFF_MS
        assert view.partitions == PARTITIONS


def test_the_first_polls_are_small_and_double_up_to_the_poll_size(
    kafka_bootstrap: str, filled_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(poller, "FIRST_POLL_RECORDS", 50)
    options = ProjectorOptions(max_poll_records=400, poll_timeout=0.5, timeout=10.0)
    fetcher = poller.Fetcher(FeedSpec((kafka_bootstrap,), filled_topic, PARTITIONS, (), options).at({}))
    try:
        sizes: list[int] = []
        for _ in range(60):  # bounded: the topic holds 600 records
            if sum(sizes) >= TURNS:
                break
            got = sum(len(b.items) for b in fetcher.fetch(0.5))
            if got:
                sizes.append(got)
        assert sum(sizes) == TURNS
        assert 0 < sizes[0] <= 50
        assert all(size <= min(400, 50 * 2**i) for i, size in enumerate(sizes)), sizes
        assert max(sizes) > 100, sizes  # it grew: the whole topic was there to fill the later polls
        fetcher.seek({p: 0 for p in range(PARTITIONS)})  # a restart starts small again
        first = []
        for _ in range(20):
            first = fetcher.fetch(0.5)
            if first:
                break
        assert 0 < sum(len(b.items) for b in first) <= 50
    finally:
        fetcher.close()
