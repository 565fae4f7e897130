"""``throughline repair`` appends its record through the producer path, on the project's partition.

What the projector does with the record (applying it in the DuckDB projection, replay equal to the
stream) is tested with the store's repair application; here: the record's place, key and bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support.topic import read_topic

from throughline.core.identity import project_sha256, source_sha256
from throughline.core.partitioning import partition_for
from throughline.core.repair import RepairRecord
from throughline.producers import TurnProducer
from throughline.schemas.codec import decode_record

CLI = str(Path(sys.executable).with_name("throughline"))
PROJECTS = ["/srv/alpha", "/srv/beta", "/srv/gamma"]


def repair(bootstrap: str, topic: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THROUGHLINE_")}
    return subprocess.run(
        [CLI, "repair", "--bootstrap-servers", bootstrap, "--topic", topic, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


def test_a_repair_lands_after_the_projects_turns_on_its_partition(kafka_bootstrap: str, kafka_topic_name: str) -> None:
    with TurnProducer(kafka_bootstrap, kafka_topic_name, partitions=3) as producer:
        for i, project in enumerate(PROJECTS * 2):
            producer.append(project=project, host="host-a", thread="main", turn_id=f"t{i}", completed_at=i, body="b")
    done = repair(
        kafka_bootstrap,
        kafka_topic_name,
        "--project",
        "/srv/beta/",
        "--host",
        "host-a",
        "--thread",
        "main",
        "--reason",
        "seq 2 is lost",
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    project = project_sha256("/srv/beta")
    source = source_sha256(project, "host-a", "main")
    assert out["repair"]["projectSha256"] == project.hex() and out["repair"]["sourceSha256"] == source.hex()
    home = partition_for(project, 3)
    before = sum(1 for p in PROJECTS * 2 if partition_for(project_sha256(p), 3) == home)
    assert out["appended"] == {"partition": home, "offset": before}  # after the turns of that partition
    assert "takes effect when the projector applies" in done.stderr

    stored = {(r.partition, r.offset): r for r in read_topic(kafka_bootstrap, kafka_topic_name)}
    record = stored[(out["appended"]["partition"], out["appended"]["offset"])]
    assert record.key == project
    decoded = decode_record(record.value)
    assert isinstance(decoded, RepairRecord)
    assert (decoded.project_sha256, decoded.source_sha256, decoded.reason) == (project, source, "seq 2 is lost")
    assert decoded.producer.name == "throughline-repair" and decoded.producer.produced_at_micros > 0
    for raw in (b"/srv/beta", b"host-a", b"main"):
        assert raw not in record.value  # hash-only on the log

    by_hash = repair(
        kafka_bootstrap, kafka_topic_name, "--project", "/srv/beta", "--source", source.hex(), "--reason", "again"
    )
    assert by_hash.returncode == 0, by_hash.stderr
    assert json.loads(by_hash.stdout)["appended"] == {"partition": home, "offset": before + 1}


def test_a_repair_never_creates_the_topic(kafka_bootstrap: str, kafka_topic_name: str) -> None:
    done = repair(kafka_bootstrap, kafka_topic_name, "--project", "/p", "--host", "h", "--thread", "t", "--reason", "r")
    assert done.returncode == 1
    assert json.loads(done.stderr.strip().splitlines()[-1])["error"]["code"] == "topic_missing"
