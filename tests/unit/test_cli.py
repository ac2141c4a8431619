"""The dispatcher turns the errors a subcommand names in USAGE_ERRORS into one line and exit status 2,
and nothing else: any other exception is a bug and keeps its traceback."""

from __future__ import annotations

import argparse
import errno
import sys
import types

import pytest

from inferwatch import cli


class BadOption(ValueError):
    pass


class CannotListen(OSError):
    pass


@pytest.fixture
def fake_command(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = types.ModuleType("fake_command")
    module.USAGE_ERRORS = (BadOption, CannotListen)
    module.add_arguments = lambda parser: parser.add_argument("what")

    def main(args: argparse.Namespace) -> int:
        raise {
            "option": BadOption("--size: must be > 0, got -1"),
            "listen": CannotListen(errno.EADDRINUSE, "cannot serve metrics on 127.0.0.1:1: in use"),
            "bug": ValueError("a bug, not bad configuration"),
        }[args.what]

    module.main = main
    monkeypatch.setitem(sys.modules, "fake_command", module)
    monkeypatch.setitem(cli.COMMANDS, "fake", ("fake_command", "a command for this test"))
    return module


@pytest.mark.parametrize(
    ("what", "line"),
    [
        ("option", "inferwatch fake: --size: must be > 0, got -1"),
        ("listen", "inferwatch fake: cannot serve metrics on 127.0.0.1:1: in use"),
    ],
)
def test_a_named_usage_error_is_one_line_and_exit_2(
    fake_command: types.ModuleType, capsys: pytest.CaptureFixture[str], what: str, line: str
) -> None:
    assert cli.main(["fake", what]) == 2
    assert capsys.readouterr().err.splitlines() == [line]


def test_any_other_exception_is_not_swallowed(fake_command: types.ModuleType) -> None:
    with pytest.raises(ValueError, match="a bug"):
        cli.main(["fake", "bug"])
