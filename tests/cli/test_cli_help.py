"""The CLI's own surface, without a gateway: version, help on everything, the --json switch."""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Iterator

import pytest

from mqgate import __version__
from mqgate.cli import build_parser
from tests.conftest import MQGATE


def parsers(
    parser: argparse.ArgumentParser, path: str = "mqgate"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every parser of the command tree, with the command line that reaches it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, f"{path} {name}")


def test_every_command_and_option_has_a_help_text() -> None:
    missing = []
    for path, parser in parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                missing += [f"{path} {c.dest}" for c in action._choices_actions if not c.help]
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, f"no help text: {missing}"
    assert len(list(parsers(build_parser()))) > 12  # the walk reached the leaves


def test_help_of_every_command_prints() -> None:
    for path, _ in parsers(build_parser()):
        out = subprocess.run(
            [MQGATE, *path.split()[1:], "--help"], capture_output=True, text=True, timeout=60, check=False
        )
        assert out.returncode == 0 and out.stdout.startswith("usage: " + path), (path, out.stdout, out.stderr)


def test_version() -> None:
    out = subprocess.run([MQGATE, "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0 and out.stdout.strip() == f"mqgate {__version__}", out


@pytest.mark.parametrize(
    ("argv", "as_json"),
    [
        (["--json", "topic", "list"], True),
        (["topic", "list", "--json"], True),
        (["--json", "consumer", "progress", "c"], True),
        (["consumer", "progress", "c", "--json"], True),
        (["consumer", "progress", "c"], False),
        (["alerts"], False),
    ],
)
def test_one_json_switch_before_or_after_the_command(argv: list[str], as_json: bool) -> None:
    assert build_parser().parse_args(argv).json is as_json


def test_text_layout_of_any_answer() -> None:
    """What a command without a layout of its own prints: `key: value` lines, lists as tables."""
    from mqgate.cli.admin import generic_text, table

    answer = {
        "name": "c",
        "paused": False,
        "tags": ["a", "b"],
        "rows": [{"queue": 0, "lag": 12}, {"queue": 10, "lag": 3}],
    }
    assert generic_text(answer) == [
        "name: c",
        "paused: no",
        "tags: a,b",
        "rows:",
        "  queue  lag",
        "      0   12",
        "     10    3",
    ]
    assert table([], ["x"], "nothing") == ["nothing"]
    assert table([{"x": None, "y": "long text"}], ["x", "y"], "") == ["x  y", "-  long text"]
