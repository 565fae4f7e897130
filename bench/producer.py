"""Item 5: ``TurnProducer`` throughput as a ratio of a bare kafka-python producer sending the same bytes.

Both send the same turns to a fresh topic of the same shape, with the same delivery settings (acks=all,
idempotent, ``TurnProducer``'s linger and batch size), pipelined: hand every record over, then wait for
every acknowledgement. ``TurnProducer`` starts from ``TurnRecord`` values (it re-validates and encodes
each); the bare producer starts from the already-encoded bytes. Connecting and creating the topic are
outside the clock for both.
"""

from __future__ import annotations

import statistics
import time

from bench.common import (
    Config,
    Encoded,
    Figure,
    Section,
    Target,
    against_noise,
    bare_producer,
    create_topic,
    delete_topics,
    end_offsets,
    log,
    new_topic_name,
    wants_profile,
)
from bench.profile import recording
from throughline.core.turn import TurnRecord
from throughline.producers.producer import COMPRESSION, TurnProducer, batch_bytes


def run_turn_producer(bootstrap: str, topic: str, turns: list[TurnRecord], partitions: int) -> float:
    """Seconds for ``TurnProducer.send_many`` to append ``turns`` (all acknowledged)."""
    with TurnProducer(bootstrap, topic, partitions=partitions) as producer:
        start = time.perf_counter()
        positions = producer.send_many(turns)
        seconds = time.perf_counter() - start
    if len(positions) != len(turns):
        raise RuntimeError("TurnProducer lost acknowledgements")
    return seconds


def run_bare_producer(bootstrap: str, topic: str, data: Encoded, partitions: int) -> float:
    """Seconds for a bare ``KafkaProducer`` to send the same bytes (all acknowledged)."""
    create_topic(bootstrap, topic, partitions)
    producer = bare_producer(bootstrap, compression_type=COMPRESSION)  # TurnProducer's codec too
    try:
        producer.partitions_for(topic)  # metadata outside the clock, as TurnProducer's constructor does
        start = time.perf_counter()
        futures = [
            producer.send(topic, value=v, key=k, partition=p)
            for k, v, p in zip(data.keys, data.values, data.partitions, strict=True)
        ]
        producer.flush(timeout=600)
        for f in futures:
            f.get(timeout=60)
        return time.perf_counter() - start
    finally:
        producer.close(timeout=30)


def measure(cfg: Config, bootstrap: str, turns: list[TurnRecord], data: Encoded) -> Section:
    """Interleave the two producers (``--ratio-repeat`` times, at least ``--repeat``); report their rates
    and the median of the per-repetition ratios, with the interval that tells a miss from noise."""
    ours: list[float] = []
    bare: list[float] = []
    ratios: list[float] = []
    topics: list[str] = []
    n = len(turns)
    for rep in range(max(cfg.repeat, cfg.ratio_repeat)):
        t_bare = new_topic_name("producer-bare")
        t_ours = new_topic_name("producer-turn")
        topics += [t_bare, t_ours]
        sb = run_bare_producer(bootstrap, t_bare, data, cfg.partitions)
        so = run_turn_producer(bootstrap, t_ours, turns, cfg.partitions)
        for t in (t_bare, t_ours):
            if sum(end_offsets(bootstrap, t).values()) != n:
                raise RuntimeError(f"topic {t} does not hold {n} records")
        bare.append(n / sb)
        ours.append(n / so)
        ratios.append((n / so) / (n / sb))
        log(f"producer rep {rep + 1}: bare {n / sb:,.0f}/s, TurnProducer {n / so:,.0f}/s")
        delete_topics(bootstrap, [t_bare, t_ours])
    bare_fig = Figure("bare kafka-python producer, same bytes", bare, "records/s")
    ours_fig = Figure("`TurnProducer.send_many`", ours, "records/s")
    section = Section("producer", "5. Producer: `TurnProducer` against a bare kafka-python producer")
    section.figures = [
        bare_fig,
        ours_fig,
        Figure("TurnProducer / bare producer (per repetition)", ratios, "ratio", "{:.2f}"),
    ]
    median_ratio = statistics.median(ratios) if ratios else None
    section.targets = [
        Target("TurnProducer >= 0.8 of the bare producer", median_ratio, 0.8, text=against_noise(ratios, 0.8))
    ]
    if wants_profile(cfg, section.targets):
        topic = new_topic_name("producer-profile")
        sample = turns[: min(n, 50_000)]
        with recording("`TurnProducer.send_many` (profile run)", cfg.workdir / "producer.pyspy") as got:
            run_turn_producer(bootstrap, topic, sample, cfg.partitions)
        delete_topics(bootstrap, [topic])
        section.profiles.append(got[0].markdown())
        section.targets[0].bottleneck = got[0].bottleneck()
    section.notes = [
        f"{n:,} turns of ~{data.value_bytes // max(1, n):,} encoded bytes, {cfg.partitions} partitions, "
        f"acks=all, idempotent, linger 5 ms, batches of {batch_bytes(COMPRESSION) // 1024} KiB of records, "
        f"{COMPRESSION} compression (TurnProducer's "
        "settings) for both.",
        f"The target ratio is the median of {len(ratios)} per-repetition ratios (each repetition's two "
        "producers run back to back, the bare one first), with a distribution-free interval of that median; "
        "the bare producer's rate alone varies by up to 1.5x between repetitions on this machine.",
        "TurnProducer starts from `TurnRecord` values and re-validates (`build_turn`: canonical project, "
        "SHA-256 content digest) and Avro-encodes each; the bare producer sends pre-encoded bytes.",
    ]
    return section
