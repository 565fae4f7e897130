"""Appends throughline turns with librdkafka's Python client, confluent-kafka (docs/kafka.md, "Writing
turns from another client").

A turn is one record: key = the 32-byte SHA-256 of the canonical project, value = the turn's Avro
single-object encoding (schemas/completed_turn.v2.avsc), no headers. librdkafka's default partitioner
(``consistent_random``: CRC-32 of the key) is NOT the Java client's: ``partitioner=murmur2_random`` is
the one that puts a turn on the partition throughline computes. Any ``compression.type``.

Run with an interpreter that has confluent-kafka (it needs nothing of throughline):
    python librdkafka_turn_producer.py BOOTSTRAP TOPIC < lines
Input lines: ``producer CODEC [TRANSACTIONAL_ID]`` starts a producer (closing the one before), then
``KEY_HEX VALUE_HEX`` per record and, for a transactional producer, ``begin``, ``commit`` and ``abort``.
Output: ``PARTITION OFFSET`` of every record, in input order, once its producer closes.
(tests/integration/test_other_clients.py runs this file.)
"""

import sys

from confluent_kafka import KafkaException, Producer

TIMEOUT_S = 60.0


def open_producer(bootstrap, codec, transactional_id):
    config = {
        "bootstrap.servers": bootstrap,
        "partitioner": "murmur2_random",  # the Java client's partitioner for keyed records
        "acks": "all",
        "enable.idempotence": True,  # a retried send is neither duplicated nor reordered
        "compression.type": codec,  # none, gzip, snappy, lz4 or zstd: throughline reads each
        "message.max.bytes": 1048576,  # the topic's max.message.bytes (a body is at most 512 KiB)
        "linger.ms": 5,
    }
    if transactional_id:
        config["transactional.id"] = transactional_id
    producer = Producer(config)
    if transactional_id:
        producer.init_transactions(TIMEOUT_S)
    return producer


def close(producer, sent):
    if producer.flush(TIMEOUT_S) != 0:
        raise SystemExit("records still unacknowledged after the flush")
    for slot in sent:
        if not slot:
            raise SystemExit("a record has no delivery report")
        error, partition, offset = slot
        if error is not None:
            raise SystemExit(f"a record failed: {error}")
        print(partition, offset)
    sent.clear()


def main(bootstrap, topic):
    producer, sent = None, []
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "producer":
            if producer is not None:
                close(producer, sent)
            producer = open_producer(bootstrap, words[1], words[2] if len(words) > 2 else None)
        elif words[0] == "begin":
            producer.begin_transaction()
        elif words[0] == "commit":
            producer.commit_transaction(TIMEOUT_S)
        elif words[0] == "abort":
            producer.flush(TIMEOUT_S)  # the records are in the log; the abort marker then hides them
            producer.abort_transaction(TIMEOUT_S)
        else:
            slot = []
            sent.append(slot)

            def delivered(err, msg, slot=slot):
                slot[:] = [err, msg.partition(), msg.offset()]

            # No partition given: the configured partitioner picks murmur2(key) % partitions.
            producer.produce(topic, key=bytes.fromhex(words[0]), value=bytes.fromhex(words[1]), on_delivery=delivered)
            producer.poll(0)
    if producer is not None:
        close(producer, sent)


if __name__ == "__main__":
    try:
        main(sys.argv[1], sys.argv[2])
    except KafkaException as exc:
        raise SystemExit(f"kafka error: {exc}") from None
