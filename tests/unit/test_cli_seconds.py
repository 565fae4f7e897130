"""Every flag given in seconds refuses what is not a finite number >= 0, the same way in every command."""

from __future__ import annotations

import pytest

from throughline.cli import main


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--read-wait", "inf"],
        ["serve", "--max-wait", "-1"],
        ["ingest", "--send-timeout", "nan"],
        ["ingest", "--connect-timeout", "soon"],
        ["read", "--project", "p", "--wait-timeout", "inf"],
    ],
)
def test_a_bad_number_of_seconds_is_a_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert '"code": "invalid_arguments"' in capsys.readouterr().err


def test_the_hook_refuses_an_unbounded_timeout_but_never_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hook", "claude-code", "--timeout", "inf"]) == 1
    assert "finite number of seconds" in capsys.readouterr().err
