"""The Kafka Streams peer of the benchmark (bench/peers/kafka-streams, item 8) folds by the projector's
rules: on a topic with rewinds, duplicates, gaps, a bad content digest, a record
under another project's key and an older schema version it reaches the projector's chains (length, head
chain digest, broken mark), and the bench's gate refuses it once one chain is changed. Built with Maven
into the bench's peer cache (the first run downloads from Maven Central); runs against the real broker."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # the bench package lives beside the tests, not in the installed package
    sys.path.insert(0, str(REPO))
from bench import streams_peer  # noqa: E402
from bench.common import bare_producer, create_topic, delete_topics, new_topic_name  # noqa: E402
from bench.projector import run_projector  # noqa: E402
from throughline.core.turn import build_turn  # noqa: E402
from throughline.schemas.codec import encode_datum, encode_turn, turn_to_avro  # noqa: E402

P1, P2 = "/peer/one", "/peer/two"


def _turn(project: str, host: str, turn_id: str, body: str, seq: int | None = None) -> object:
    return build_turn(
        project=project,
        host=host,
        thread="t",
        turn_id=turn_id,
        completed_at_micros=1_700_000_000_000_000,
        body=body,
        seq=seq,
    )


def _records() -> list[tuple[bytes, bytes]]:
    """(key, value) in log order, one partition."""
    out: list[tuple[bytes, bytes]] = []

    def put(rec: object, *, key: bytes | None = None, value: bytes | None = None) -> None:
        out.append((key or rec.project_sha256, value or encode_turn(rec)))  # type: ignore[attr-defined]

    a = [_turn(P1, "a", f"a{i}", f"body {i}") for i in range(1, 4)]
    for rec in a:
        put(rec)  # a: 1, 2, 3
    put(a[1])  # the same turn again: a duplicate
    put(_turn(P1, "a", "a4", "rewound", seq=2))  # rewinds a to 2
    put(_turn(P1, "a", "a5", "gap", seq=9))  # a gap: quarantined, a broken
    put(_turn(P1, "a", "a6", "after the gap"))  # appends at 3
    b1 = _turn(P1, "b", "b1", "first")
    put(b1)
    # a gap: quarantined, b broken (the peer quarantines a turn id re-sent with other content, which the
    # projector now takes as an amend: the bench's topics never re-send one, so that case is left out here)
    put(_turn(P1, "b", "b9", "gap", seq=7))
    bad = turn_to_avro(_turn(P1, "b", "b2", "digest"))  # type: ignore[arg-type]
    bad["contentDigest"] = bytes(32)
    put(b1, value=encode_datum(bad, 2))  # an unsound record: quarantined, b not marked for it
    old = turn_to_avro(_turn(P1, "b", "b3", "schema v1"))  # type: ignore[arg-type]
    old["producer"] = {k: v for k, v in old["producer"].items() if k != "attributes"}
    put(b1, value=encode_datum(old, 1))  # written with schema version 1: appends at 2
    c1 = _turn(P2, "c", "c1", "wrong key")
    put(c1, key=b1.project_sha256)  # type: ignore[attr-defined]  # under P1's key: quarantined
    put(_turn(P2, "c", "c2", "right key"))
    return out


def test_the_peer_folds_as_the_projector_does(kafka_bootstrap: str, tmp_path: Path) -> None:
    topic = new_topic_name("kspeer")
    create_topic(kafka_bootstrap, topic, 1)
    try:
        records = _records()
        producer = bare_producer(kafka_bootstrap)
        for key, value in records:
            producer.send(topic, key=key, value=value, partition=0)
        producer.flush(timeout=60)
        producer.close(timeout=30)
        db = tmp_path / "projector.duckdb"
        run_projector(kafka_bootstrap, topic, db, len(records))
        reference = streams_peer.projector_chains(db)
        assert sorted(length for length, _, _ in reference.values()) == [1, 2, 3]  # c, b, a
        assert sorted(broken for _, _, broken in reference.values()) == [False, True, True]
        run = streams_peer.run_fold(kafka_bootstrap, topic, "at_least_once", len(records), tmp_path)
        assert run.quarantined == 4
        streams_peer.require_agreement(reference, run.chains, "Kafka Streams")
        source, (length, digest, broken) = next(iter(run.chains.items()))
        changed = dict(run.chains) | {source: (length, bytes(32), broken)}
        with pytest.raises(streams_peer.PeerDisagreesError, match="head chain digest differs"):
            streams_peer.require_agreement(reference, changed, "Kafka Streams")
    finally:
        delete_topics(kafka_bootstrap, [topic])
