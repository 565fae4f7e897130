"""``serve --group/--advertise/--copies`` and their variables: what makes a member, what is refused (exit 2)."""

from __future__ import annotations

import argparse

import pytest

from throughline.cli import build_parser
from throughline.commands.serve import _group_spec
from throughline.projector.group_runner import GroupSpec
from throughline.serve.exceptions import InvalidGroupOptionError

VARIABLES = (
    "THROUGHLINE_GROUP",
    "THROUGHLINE_ADVERTISE_URL",
    "THROUGHLINE_COPIES",
    "THROUGHLINE_GROUP_SESSION_TIMEOUT_MS",
    "THROUGHLINE_GROUP_MAX_POLL_INTERVAL_MS",
    "THROUGHLINE_GROUP_PEER_BOOTSTRAP",
)


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def test_without_group_serve_is_one_process() -> None:
    assert _group_spec(_args()) is None


def test_the_flags_make_a_member() -> None:
    spec = _group_spec(_args("--group", "g1", "--advertise", "http://10.0.0.5:8080/", "--copies", "3"))
    assert spec == GroupSpec(group="g1", url="http://10.0.0.5:8080", copies=3)


def test_the_variables_make_the_same_member_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THROUGHLINE_GROUP", "g1")
    monkeypatch.setenv("THROUGHLINE_ADVERTISE_URL", "http://10.0.0.5:8080")
    monkeypatch.setenv("THROUGHLINE_COPIES", "2")
    assert _group_spec(_args()) == GroupSpec(group="g1", url="http://10.0.0.5:8080", copies=2)
    assert _group_spec(_args("--copies", "1", "--group", "g2")) == GroupSpec(
        group="g2", url="http://10.0.0.5:8080", copies=1
    )
    monkeypatch.setenv("THROUGHLINE_GROUP_SESSION_TIMEOUT_MS", "6000")
    spec = _group_spec(_args())
    assert spec is not None and spec.session_timeout_ms == 6000 and spec.max_poll_interval_ms is None
    monkeypatch.setenv("THROUGHLINE_GROUP_MAX_POLL_INTERVAL_MS", "8000")
    spec = _group_spec(_args())
    assert spec is not None and spec.max_poll_interval_ms == 8000


@pytest.mark.parametrize(
    "argv",
    [
        ("--group", "g"),  # no URL to advertise
        ("--group", "g", "--advertise", "10.0.0.5:8080"),
        ("--group", "g", "--advertise", "ftp://10.0.0.5"),
        ("--group", "g", "--advertise", "http://10.0.0.5:8080/?x=1"),
        ("--group", "g", "--advertise", "http://h", "--no-projector"),
        ("--advertise", "http://h"),  # belongs to --group
        ("--copies", "2"),
        ("--group", " ", "--advertise", "http://h"),
    ],
)
def test_what_does_not_make_a_member_is_a_hard_input_error(argv: tuple[str, ...]) -> None:
    with pytest.raises(InvalidGroupOptionError) as caught:
        _group_spec(_args(*argv))
    assert caught.value.exit_code == 2 and caught.value.code == "invalid_group_option"


def test_copies_below_one_is_refused_from_the_flag_and_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit) as exited:
        _args("--group", "g", "--advertise", "http://h", "--copies", "0")
    assert exited.value.code == 2
    monkeypatch.setenv("THROUGHLINE_COPIES", "0")
    with pytest.raises(InvalidGroupOptionError):
        _group_spec(_args("--group", "g", "--advertise", "http://h"))


def test_peer_bootstrap_is_on_unless_the_variable_says_off(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ("--group", "g", "--advertise", "http://h")
    spec = _group_spec(_args(*argv))
    assert spec is not None and spec.peer_bootstrap
    for text, expected in (("on", True), ("OFF", False), (" off ", False)):
        monkeypatch.setenv("THROUGHLINE_GROUP_PEER_BOOTSTRAP", text)
        spec = _group_spec(_args(*argv))
        assert spec is not None and spec.peer_bootstrap is expected, text
    monkeypatch.setenv("THROUGHLINE_GROUP_PEER_BOOTSTRAP", "no")  # not guessed: refused, exit 2
    with pytest.raises(InvalidGroupOptionError) as caught:
        _group_spec(_args(*argv))
    assert caught.value.exit_code == 2 and "THROUGHLINE_GROUP_PEER_BOOTSTRAP" in caught.value.message
