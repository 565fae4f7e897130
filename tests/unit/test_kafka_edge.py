"""One Kafka edge: every kafka-python client is built in ``throughline/log/clients.py``, only the
translation reads Kafka's error classes, and every connecting call passes the connection's settings.
(Who may import kafka-python at all: tests/unit/test_import_rules.py.)"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The production packages (the design card's top-level folders installed under ``throughline``).
PRODUCTION = ("throughline", "producers", "projector", "reader", "schemas")
CLIENT_CLASSES = {"KafkaConsumer", "KafkaProducer", "KafkaAdminClient"}


def _sources() -> list[Path]:
    return sorted(p for package in PRODUCTION for p in (ROOT / package).rglob("*.py"))


def test_every_kafka_client_is_built_in_the_clients_module() -> None:
    builders: dict[str, list[str]] = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                if name in CLIENT_CLASSES:
                    builders.setdefault(str(path.relative_to(ROOT)), []).append(f"{name} line {node.lineno}")
    assert set(builders) <= {"throughline/log/clients.py"}, builders
    source = (ROOT / "throughline" / "log" / "clients.py").read_text("utf-8")
    assert all(f"partial(_build, {cls})" in source for cls in CLIENT_CLASSES)


def test_kafka_error_classes_are_read_only_by_the_translation() -> None:
    readers = []
    for path in (ROOT / "throughline" / "log").glob("*.py"):
        text = path.read_text("utf-8")
        for name in (
            "SaslAuthenticationFailedError",
            "OffsetOutOfRangeError",
            "MessageSizeTooLargeError",
            "KafkaTimeoutError",
        ):
            if name in text:
                readers.append(path.name)
    assert set(readers) == {"translate.py"}, readers


#: Who imports ``kafka.errors``: the translation, and the record reader, which raises the errors
#: kafka-python's own parser raises (from inside kafka-python's fetcher, which handles them as its own).
ERRORS_IMPORTERS = {"translate.py", "fetch.py"}


def test_kafka_errors_are_imported_only_by_the_translation_and_the_record_reader() -> None:
    importers = set()
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            if any(n == "kafka.errors" or n.startswith("kafka.errors.") for n in names):
                importers.add(str(path.relative_to(ROOT)))
    assert importers == {f"throughline/log/{name}" for name in ERRORS_IMPORTERS}, importers


#: What builds Kafka clients outside ``throughline/log``; each call must say which settings it connects with.
CONNECTING = {
    "TurnProducer",
    "KafkaLog",
    "Projector",
    "replay",
    "ensure_topic",
    "describe_topic",
    "PartitionConsumer",
    "GroupConsumer",
    "RecordSource",
    "RecordSink",
    "export_log",
    "import_backup",
}


def test_every_connecting_call_passes_the_kafka_config() -> None:
    missing = []
    for path in _sources():
        if path.is_relative_to(ROOT / "throughline" / "testing"):
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                if name in CONNECTING and not any(k.arg in ("kafka_config", None) for k in node.keywords):
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}(...)")
    # A call without kafka_config= would silently drop the --kafka-config flag (only the variable applies).
    assert not missing, missing
