"""An example of a user's own integration suite on throughline's pytest fixtures (docs/testing.md).

``pip install 'throughline[test]'`` registers the fixtures; Docker and the project's image
(``docker build -t throughline:local .``) are all it needs: ``throughline_container`` is
``throughline serve`` in a container next to the session's Kafka broker. scripts/test-docker runs this
folder as a user would (``pytest examples/testcontainers``).
"""

from throughline.testing import ThroughlineContainer


# The ten lines docs/testing.md shows.
def test_my_turns_reach_the_observer(throughline_container: ThroughlineContainer, throughline_project: str) -> None:
    tl = throughline_container
    for n, body in enumerate(["plan the change", "write the patch", "run the checks"], start=1):
        tl.append(
            project=throughline_project,
            host="my-agent",
            thread="t1",
            turn_id=f"turn-{n}",
            completed_at=f"2025-01-01T00:00:0{n}Z",
            body=body,
        )
    page = tl.read(throughline_project)
    assert page.status == "ok" and page.page.complete
    assert [(t.seq, t.body) for t in page.turns] == [
        (1, "plan the change"),
        (2, "write the patch"),
        (3, "run the checks"),
    ]


def test_a_rollback_is_seen_as_resync_then_a_fresh_chain(
    throughline_container: ThroughlineContainer, throughline_project: str
) -> None:
    """The Observer's cursor names a prefix; when the host rewinds the thread under it, the reader says so."""
    tl = throughline_container
    tl.append_lines(
        {
            "project": throughline_project,
            "host": "my-agent",
            "thread": "t1",
            "turnId": f"a{n}",
            "completedAt": f"2025-01-01T00:00:0{n}Z",
            "body": f"first try {n}",
        }
        for n in (1, 2, 3)
    )
    first = tl.read(throughline_project)
    assert [t.seq for t in first.turns] == [1, 2, 3]
    tl.append(
        project=throughline_project,
        host="my-agent",
        thread="t1",
        turn_id="b2",
        completed_at="2025-01-01T00:00:05Z",
        body="second try",
        seq=2,
    )
    after = tl.read(throughline_project, after_cursor=first.throughCursor)
    assert after.status == "resync_required"
    fresh = tl.read(throughline_project)
    assert [(t.seq, t.body) for t in fresh.turns] == [(1, "first try 1"), (2, "second try")]


def test_a_container_of_my_own_with_its_own_topic(throughline_container_factory, throughline_project: str) -> None:
    """One serve per test when a test needs a clean log (slower: a container start each)."""
    tl = throughline_container_factory(topic=f"my.turns.{throughline_project}")
    assert tl.topic == f"my.turns.{throughline_project}"
    tl.append(
        project=throughline_project,
        host="h",
        thread="t",
        turn_id="1",
        completed_at="2025-01-01T00:00:00Z",
        body="hello",
    )
    assert [t.body for t in tl.read(throughline_project).turns] == ["hello"]
