"""``forward_read``: a member passing a read on to a holder of its partition, against real loopback
servers (the read API over a ``World``, and a scripted server that records what it was sent)."""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Iterator

import pytest
from reader_world import PROJECT, World
from served_app import Answer, ApiSettings, ScriptedServer, ServedApp, closed_url, error_answer

from throughline.serve import READ_PATH
from throughline.serve.exceptions import AlreadyForwardedError, ForwardFailedError
from throughline.serve.forward import FORWARDED_HEADER, forward_read, is_forwarded
from throughline.serve.transport import new_opener, send

TOKEN = "forward-test-token-abcdefghijklmn"
ME = "http://127.0.0.1:1"  # the forwarding member's advertised URL (nothing needs to listen there)


@pytest.fixture
def app(http_world: World) -> Iterator[ServedApp]:
    """The read API with a bearer token, as every member of a group has it."""
    with ServedApp(http_world, ApiSettings(read_wait=0.0, auth_token=TOKEN)) as served:
        yield served


def _direct(
    url: str, method: str, target: str, body: bytes | None, headers: dict[str, str]
) -> tuple[int, dict[str, str], bytes]:
    return send(new_opener(), url, method, target, body, headers, 10.0)


def test_a_forwarded_post_is_answered_byte_for_byte_as_the_holder_answers_it(app: ServedApp) -> None:
    body = json.dumps({"project": PROJECT, "limit": 2}).encode()
    incoming = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json", "Accept": "application/json"}
    forwarded = forward_read(
        [app.url], method="POST", target=READ_PATH, body=body, headers=incoming, via=ME, timeout=10
    )
    status, headers, direct = _direct(app.url, "POST", READ_PATH, body, incoming)
    assert (forwarded.url, forwarded.status, forwarded.body) == (app.url, status, direct)
    assert dict(forwarded.headers) == {k: headers[k] for k in ("content-type", "cache-control") if k in headers}
    assert json.loads(forwarded.body)["status"] == "ok"


def test_a_forwarded_get_keeps_its_query_and_the_pending_reason(http_world: World, app: ServedApp) -> None:
    http_world.append(apply=False)  # the log is ahead of the projection: projection_pending with a reason
    target = READ_PATH + "?" + urllib.parse.urlencode({"project": PROJECT, "limit": 5})
    incoming = {"authorization": f"Bearer {TOKEN}"}
    forwarded = forward_read([app.url], method="GET", target=target, body=None, headers=incoming, via=ME, timeout=10)
    assert forwarded.status == 200
    assert json.loads(forwarded.body)["status"] == "projection_pending"
    assert dict(forwarded.headers)["throughline-reason"]


def test_the_holders_refusals_come_back_unchanged(app: ServedApp) -> None:
    body = json.dumps({"project": PROJECT, "limit": 0}).encode()
    refused = forward_read(
        [app.url],
        method="POST",
        target=READ_PATH,
        body=body,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        via=ME,
        timeout=10,
    )
    assert refused.status == 400 and json.loads(refused.body)["error"]["code"] == "invalid_limit"
    unauthorized = forward_read(
        [app.url],
        method="POST",
        target=READ_PATH,
        body=body,
        headers={"Content-Type": "application/json"},
        via=ME,
        timeout=10,
    )
    assert unauthorized.status == 401
    assert dict(unauthorized.headers)["www-authenticate"].lower().startswith("bearer")


def test_one_hop_the_original_authorization_and_nothing_else() -> None:
    with ScriptedServer(
        Answer(200, b'{"schema":"x"}', {"Content-Type": "application/json", "Set-Cookie": "a=b", "X-Internal": "1"})
    ) as holder:
        incoming = {
            "Authorization": "Bearer original-caller-token-0123456789",
            "Content-Type": "application/json",
            "Cookie": "session=secret",
            "X-Forwarded-For": "10.0.0.1",
            "Host": "member-a",
        }
        answer = forward_read(
            [holder.url], method="POST", target=READ_PATH, body=b'{"project":"p"}', headers=incoming, via=ME, timeout=10
        )
        assert answer.body == b'{"schema":"x"}'
        assert dict(answer.headers) == {"content-type": "application/json"}  # no cookie, no internal header
        (received,) = holder.received
        assert received.headers[FORWARDED_HEADER.lower()] == ME
        assert received.headers["authorization"] == "Bearer original-caller-token-0123456789"
        assert "cookie" not in received.headers and "x-forwarded-for" not in received.headers
        assert received.headers["host"] != "member-a"
        assert received.body == b'{"project":"p"}'
        assert is_forwarded(received.headers)


def test_a_forwarded_request_is_never_forwarded_again() -> None:
    with ScriptedServer(Answer()) as holder:
        for marker in (FORWARDED_HEADER, FORWARDED_HEADER.lower(), FORWARDED_HEADER.upper()):
            with pytest.raises(AlreadyForwardedError) as caught:
                forward_read(
                    [holder.url],
                    method="GET",
                    target=READ_PATH,
                    body=None,
                    headers={marker: "http://x:1"},
                    via=ME,
                    timeout=5,
                )
            assert caught.value.retriable
        assert holder.received == []
    assert not is_forwarded({"Authorization": "Bearer x"})


def test_a_member_never_forwards_to_itself() -> None:
    with ScriptedServer(Answer()) as me:
        with pytest.raises(ForwardFailedError):
            forward_read(
                [me.url, me.url + "/"], method="GET", target=READ_PATH, body=None, headers={}, via=me.url, timeout=5
            )
        assert me.received == []


def test_an_unreachable_or_503_holder_is_passed_over(app: ServedApp) -> None:
    body = json.dumps({"project": PROJECT}).encode()
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    with ScriptedServer(error_answer(503, "projection_pending_elsewhere")) as busy:
        answer = forward_read(
            [closed_url(), busy.url, app.url],
            method="POST",
            target=READ_PATH,
            body=body,
            headers=headers,
            via=ME,
            timeout=5,
        )
        assert answer.url == app.url and answer.status == 200 and len(busy.received) == 1
        only_busy = forward_read(
            [busy.url], method="POST", target=READ_PATH, body=body, headers=headers, via=ME, timeout=5
        )
        assert only_busy.status == 503  # the last 503 answer, unchanged
        assert json.loads(only_busy.body)["error"]["code"] == "projection_pending_elsewhere"


def test_forwarding_is_bounded_in_time() -> None:
    with ScriptedServer(Answer(200, b"{}", delay=5.0)) as slow, ScriptedServer(Answer(200, b'{"fast":1}')) as fast:
        started = time.monotonic()
        with pytest.raises(ForwardFailedError) as caught:
            forward_read([slow.url], method="GET", target=READ_PATH, body=None, headers={}, via=ME, timeout=0.5)
        assert time.monotonic() - started < 4.5  # well before the slow holder's answer
        assert caught.value.retriable and caught.value.code == "forward_failed"
        answer = forward_read(
            [slow.url, fast.url], method="GET", target=READ_PATH, body=None, headers={}, via=ME, timeout=0.5
        )
        assert answer.url == fast.url and answer.body == b'{"fast":1}'
        with pytest.raises(ForwardFailedError):  # the deadline ends every attempt, the fast one's too
            forward_read(
                [slow.url, fast.url],
                method="GET",
                target=READ_PATH,
                body=None,
                headers={},
                via=ME,
                timeout=0.5,
                deadline=time.monotonic() + 0.3,
            )


@pytest.mark.parametrize(
    ("method", "target"),
    [("DELETE", READ_PATH), ("GET", "/metrics"), ("GET", "/v1/projects/readx"), ("POST", "http://evil" + READ_PATH)],
)
def test_only_reads_are_forwarded(method: str, target: str) -> None:
    with pytest.raises(ValueError):
        forward_read(["http://127.0.0.1:2"], method=method, target=target, body=None, headers={}, via=ME, timeout=1)
