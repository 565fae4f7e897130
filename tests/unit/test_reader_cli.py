"""``throughline read`` / ``observe`` argument handling that needs no broker."""

from __future__ import annotations

import json

import pytest

from throughline.cli import main
from throughline.commands.read import parse_limit


@pytest.mark.parametrize(("text", "value"), [(None, 10), ("1", 1), ("100", 100), (" 7 ", 7), ("+5", 5)])
def test_parse_limit(text: str | None, value: int) -> None:
    assert parse_limit(text) == value


@pytest.mark.parametrize("text", ["0", "101", "-1", "abc", "1.5", "1e2", "", "10x", "9" * 40])
def test_parse_limit_refuses(text: str) -> None:
    with pytest.raises(Exception) as info:
        parse_limit(text)
    assert getattr(info.value, "code", None) == "invalid_limit"


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["read", "--project", "p", "--limit", "abc"], "invalid_limit"),
        (["read", "--project", "p", "--limit", "0"], "invalid_limit"),
        (["read", "--project", "p", "--body-limit", "-3"], "invalid_body_limit"),
        (["read", "--project", "p", "--wait", "soon"], "invalid_wait"),
        (["observe", "--project", "p", "--state", "s", "--limit", "500"], "invalid_limit"),
        (["observe", "--project", "p", "--state", "s", "--max-pending-wait", "-1"], "invalid_wait"),
        (["observe", "--project", "p", "--state", "s", "--on-resync", "ignore"], "invalid_arguments"),
        (["read"], "invalid_arguments"),
    ],
)
def test_hard_input_errors_exit_2_with_a_code(
    argv: list[str], code: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("THROUGHLINE_BOOTSTRAP_SERVERS", raising=False)
    with pytest.raises(SystemExit) if code == "invalid_arguments" else _no_raise() as exit_info:
        result = main(argv)
    status = exit_info.value.code if code == "invalid_arguments" else result
    assert status == 2
    err = capsys.readouterr()
    assert err.out == ""
    error_line = [line for line in err.err.splitlines() if line.startswith("{")][-1]
    assert json.loads(error_line)["error"]["code"] == code


class _no_raise:
    value = None

    def __enter__(self) -> _no_raise:
        return self

    def __exit__(self, *exc: object) -> bool:
        return False
