"""The record reader hook switches on by kafka-python version, and the range it is tested with is the
range pyproject pins; on any other version the consumer keeps kafka-python's own parser, whose records
the projector prepares exactly as it prepares the reader's.

No broker: a ``KafkaConsumer`` built with an ``api_version`` connects lazily, and the hook only looks
at the consumer's fetcher. tests/integration/test_record_reader.py shows the two parsers read the same
records off a real topic.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import kafka
import pytest
from kafka import KafkaConsumer
from kafka.consumer.fetcher import ConsumerRecord

from throughline.core.turn import build_turn
from throughline.log import fetch
from throughline.log.fetch import TESTED_KAFKA_PYTHON, RecordReader, use_record_reader
from throughline.log.record_batch import FetchedRecord
from throughline.projector.prepare import prepare_batch
from throughline.schemas.codec import encode_turn

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _padded(version: str) -> tuple[int, ...]:
    parts = tuple(int(p) for p in version.split("."))
    return parts + (0,) * (3 - len(parts))


def _pinned_range() -> tuple[tuple[int, ...], tuple[int, ...]]:
    deps = tomllib.loads(PYPROJECT.read_text("utf-8"))["project"]["dependencies"]
    (pin,) = [d for d in deps if d.startswith("kafka-python")]
    low = re.search(r">=\s*([0-9.]+)", pin)
    high = re.search(r"<\s*([0-9.]+)", pin)
    assert low and high, f"pyproject must pin kafka-python to a closed range, not {pin!r}"
    return _padded(low.group(1)), _padded(high.group(1))


def test_the_hooks_tested_range_is_the_range_pyproject_pins() -> None:
    assert _pinned_range() == TESTED_KAFKA_PYTHON


def test_the_installed_kafka_python_is_in_the_tested_range() -> None:
    # Otherwise every test of the projector would run the fallback and none the reader.
    assert fetch.tested_kafka_python(), kafka.__version__
    assert fetch.tested_kafka_python(kafka.__version__)


@pytest.mark.parametrize(
    ("version", "tested"),
    [
        ("3.0.11", False),
        ("3.0.12", True),
        ("3.0.99", True),
        ("3.1.0", False),
        ("3.1", False),
        ("2.2.15", False),
        ("4.0.0", False),
        ("3.0.12.dev1", True),
        ("3.1.0rc1", False),
        ("", False),
        ("garbage", False),
    ],
)
def test_tested_versions_are_the_half_open_range(version: str, tested: bool) -> None:
    assert fetch.tested_kafka_python(version) is tested


@pytest.fixture
def consumer() -> KafkaConsumer:
    built = KafkaConsumer(bootstrap_servers="127.0.0.1:9", api_version=(2, 8), enable_auto_commit=False)
    yield built
    built.close()


def test_an_untested_version_leaves_kafka_pythons_parser_in_place(consumer: KafkaConsumer) -> None:
    fetcher = consumer._fetcher  # the object the hook patches; nothing else reaches it
    before = fetcher.PartitionRecords
    assert use_record_reader(consumer, version="3.1.0") is False
    assert fetcher.PartitionRecords is before and before is not RecordReader


def test_a_tested_version_plugs_the_reader_in(consumer: KafkaConsumer) -> None:
    assert use_record_reader(consumer) is True
    assert consumer._fetcher.PartitionRecords is RecordReader


def test_the_plain_path_records_prepare_as_the_readers_do() -> None:
    turns = [
        build_turn(
            project="/p",
            host="h",
            thread="t",
            turn_id=f"u{i}",
            completed_at_micros=1_700_000_000_000_000 + i,
            body=f"b{i}",
        )
        for i in range(3)
    ]
    raw = [(t.project_sha256, encode_turn(t)) for t in turns] + [(b"k", b"not avro"), (b"k", None)]
    ours = [FetchedRecord(0, offset, key, value) for offset, (key, value) in enumerate(raw)]
    stock = [
        ConsumerRecord(
            "turns", 0, 0, offset, 0, 0, key, value, [], None, len(key), -1 if value is None else len(value), -1
        )
        for offset, (key, value) in enumerate(raw)
    ]
    assert prepare_batch(0, stock, partitions=1) == prepare_batch(0, ours, partitions=1)
