"""``HttpReader`` over several URLs (the members of a ``serve --group``): fail over on a connection error
or HTTP 503 with the same request, keep the series, stay bounded; against real loopback servers."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from typing import Any

import pytest
from reader_world import PROJECT, World
from served_app import (
    Answer,
    ApiSettings,
    ScriptedServer,
    ServedApp,
    closed_url,
    error_answer,
    rest_of_series,
)

from throughline.cli import main
from throughline.core.exceptions import InvalidLimitError
from throughline.errors import ConfigurationError
from throughline.projector.exceptions import ProjectionBusyError
from throughline.serve.client import HttpReader, parse_urls
from throughline.serve.exceptions import ServerBusyError, ServerUnavailableError

TOKEN = "failover-test-token-abcdefghijkl"


def _busy() -> ScriptedServer:
    return ScriptedServer(error_answer(503, "server_busy", "too many long-polls", **{"Retry-After": "1"}))


# ----------------------------------------------------------------------------------------- the URLs


def test_urls_come_as_a_list_a_comma_separated_string_or_a_mix() -> None:
    assert parse_urls("http://a:1") == ("http://a:1",)
    assert parse_urls("http://a:1,http://b:2/") == ("http://a:1", "http://b:2")
    assert parse_urls(["http://a:1", "http://b:2,http://a:1"]) == ("http://a:1", "http://b:2")
    assert HttpReader("http://a:1, http://b:2").urls == ("http://a:1", "http://b:2")
    assert repr(HttpReader("http://a:1,http://b:2", token=TOKEN)) == "HttpReader('http://a:1,http://b:2', token=***)"
    assert repr(HttpReader("http://a:1")) == "HttpReader('http://a:1', token=None)"


@pytest.mark.parametrize(
    "bad", ["", "http://a:1,", ",http://a:1", "http://a:1,,http://b:2", "ftp://a", "http://a:1,b:2", []]
)
def test_a_bad_url_list_is_a_configuration_error(bad: Any) -> None:
    with pytest.raises(ConfigurationError) as caught:
        HttpReader(bad)
    assert caught.value.code == "invalid_url" and caught.value.exit_code == 2


# ---------------------------------------------------------------------------------------- failover


def test_an_unreachable_member_is_passed_over_and_the_next_answers(http_world: World, read_api: ServedApp) -> None:
    reader = HttpReader([closed_url(), read_api.url], timeout=5)
    read = reader.read_observer_turn_page(project=PROJECT, limit=2)
    assert read == http_world.read(PROJECT, limit=2)
    assert reader.url == read_api.url  # the next call starts with the member that answered


def test_a_503_member_is_passed_over_with_the_same_request_and_token(read_api: ServedApp) -> None:
    with _busy() as busy:
        reader = HttpReader([busy.url, read_api.url], token=None, timeout=5)
        first = reader.read_observer_turn_page(project=PROJECT)
        assert first.ok and len(busy.received) == 1
        assert reader.url == read_api.url
        reader.read_observer_turn_page(project=PROJECT)
        assert len(busy.received) == 1  # not asked again while the other answers


def test_each_member_gets_the_identical_request_with_the_original_authorization() -> None:
    with _busy() as one, ScriptedServer(error_answer(503, "projection_busy")) as two:
        reader = HttpReader([one.url, two.url], token=TOKEN, timeout=5)
        with pytest.raises(ProjectionBusyError) as caught:
            reader.read_observer_turn_page(
                project=PROJECT, after_cursor="tlc1.A", through_cursor="tlc1.B", page_token="tlp1.x.y", limit=3
            )
        assert caught.value.retriable  # the last 503 answer, typed by its code
        sent = [r for s in (one, two) for r in s.received]
        assert len(sent) == 2  # each member once: bounded
        assert sent[0].body == sent[1].body
        assert json.loads(sent[0].body) == {
            "project": PROJECT,
            "afterCursor": "tlc1.A",
            "throughCursor": "tlc1.B",
            "pageToken": "tlp1.x.y",
            "limit": 3,
        }
        assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in sent)


def test_a_series_goes_on_on_another_member_when_its_member_dies(http_world: World) -> None:
    first, second = ServedApp(http_world, ApiSettings(read_wait=0.0)), ServedApp(http_world, ApiSettings(read_wait=0.0))
    with second:
        first.__enter__()
        try:
            reader = HttpReader([first.url, second.url], timeout=5)
            after = reader.read_observer_turn_page(project=PROJECT).throughCursor
            http_world.append_many(5)
            page = reader.read_observer_turn_page(project=PROJECT, after_cursor=after, limit=2)
            assert reader.url == first.url and not page.page.complete
        finally:
            first.__exit__()  # the member that served page 1 is gone
        seqs = rest_of_series(reader, PROJECT, after, page, 2)
        assert reader.url == second.url
        assert seqs == [4, 5, 6, 7, 8]  # pinned through, token accepted by the other member: exact


def test_when_no_member_answers_the_client_says_unavailable() -> None:
    reader = HttpReader([closed_url(), closed_url()], timeout=2)
    with pytest.raises(ServerUnavailableError) as caught:
        reader.read_observer_turn_page(project=PROJECT)
    assert caught.value.retriable


def test_a_503_answer_is_preferred_to_silence() -> None:
    with _busy() as busy:
        for urls in ([busy.url, closed_url()], [closed_url(), busy.url]):
            with pytest.raises(ServerBusyError):
                HttpReader(urls, timeout=2).read_observer_turn_page(project=PROJECT)


def test_a_proxy_page_in_front_of_a_dead_member_is_passed_over(read_api: ServedApp) -> None:
    with ScriptedServer(Answer(502, b"<html>Bad Gateway</html>", {"Content-Type": "text/html"})) as proxy:
        read = HttpReader([proxy.url, read_api.url], timeout=5).read_observer_turn_page(project=PROJECT)
        assert read.ok and len(proxy.received) == 1


def test_an_input_error_is_not_failed_over(read_api: ServedApp) -> None:
    with _busy() as other:
        with pytest.raises(InvalidLimitError):
            HttpReader([read_api.url, other.url], timeout=5).read_observer_turn_page(project=PROJECT, limit=0)
        assert other.received == []  # every member would refuse it alike


def test_a_slow_member_times_out_and_the_next_answers(read_api: ServedApp) -> None:
    with ScriptedServer(Answer(200, b"{}", delay=3.0)) as slow:
        reader = HttpReader([slow.url, read_api.url], timeout=1.0)
        assert reader.read_observer_turn_page(project=PROJECT).ok


# ------------------------------------------------------------------------------------ one URL


def test_one_url_behaves_as_before() -> None:
    with _busy() as busy:
        with pytest.raises(ServerBusyError) as caught:
            HttpReader(busy.url, timeout=2).read_observer_turn_page(project=PROJECT)
        assert caught.value.retriable and len(busy.received) == 1
    with ScriptedServer(Answer(502, b"<html/>", {"Content-Type": "text/html"})) as proxy:
        with pytest.raises(ServerUnavailableError):
            HttpReader(proxy.url, timeout=2).read_observer_turn_page(project=PROJECT)
        assert len(proxy.received) == 1


# ------------------------------------------------------------------------------------ readiness


def test_readiness_comes_from_the_first_ready_member() -> None:
    not_ready = Answer(503, json.dumps({"status": "not_ready", "lag": 500}).encode())
    ready = Answer(200, json.dumps({"status": "ready", "lag": 0}).encode())
    with ScriptedServer(not_ready) as a, ScriptedServer(ready) as b:
        assert HttpReader([closed_url(), a.url, b.url], timeout=2).get_json("/readyz") == (
            200,
            {"status": "ready", "lag": 0},
        )
        assert HttpReader([a.url], timeout=2).get_json("/readyz") == (503, {"status": "not_ready", "lag": 500})


# ------------------------------------------------------------------------------------------ CLI


def _run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()


def test_read_takes_several_urls(http_world: World, read_api: ServedApp, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THROUGHLINE_URL", raising=False)
    code, out = _run(["read", "--project", PROJECT, "--limit", "2", "--url", f"{closed_url()},{read_api.url}"])
    assert code == 0
    assert json.loads(out) == json.loads(http_world.read(PROJECT, limit=2).to_json())


def test_status_asks_the_members_for_their_readiness(read_api: ServedApp, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THROUGHLINE_URL", raising=False)
    code, out = _run(["status", "--json", "--url", f"{closed_url()},{read_api.url}"])
    assert code == 0
    doc = json.loads(out)
    assert doc["url"] == read_api.url and doc["ready"] is True
    assert doc["readiness"]["status"] == "ready"
    code, text = _run(["status", "--url", read_api.url])
    assert code == 0 and text.startswith(f"serve at {read_api.url}: ready")
    monkeypatch.setenv("THROUGHLINE_URL", read_api.url)
    code, out = _run(["status", "--json"])
    assert code == 0 and json.loads(out)["url"] == read_api.url


def test_status_with_no_member_reachable_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("THROUGHLINE_URL", raising=False)
    assert main(["status", "--url", closed_url()]) == 1
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "server_unavailable"


def test_observe_takes_several_urls(read_api: ServedApp, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.delenv("THROUGHLINE_URL", raising=False)
    state = tmp_path / "observer.json"
    code, out = _run(
        ["observe", "--project", PROJECT, "--state", str(state), "--url", f"{closed_url()},{read_api.url}"]
    )
    assert code == 0
    assert [json.loads(line)["seq"] for line in out.splitlines()] == [1, 2, 3]
    assert state.exists()
