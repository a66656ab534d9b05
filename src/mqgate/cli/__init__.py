"""`mqgate`: run a gateway, and administer one over its HTTP admin API."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Final

from mqgate import __version__
from mqgate.errors import MqgateError

# Each module adds its command group; none imports more than argparse and mqgate.client until
# its command runs, so `mqgate --help` and the admin commands stay light. `mqgate serve` builds
# a parser of its own command only: a gateway's start does not load the admin commands and
# their client (0.05-0.08 s of it, issue 28).
COMMAND_GROUPS: Final = (
    "mqgate.cli.serve",
    "mqgate.cli.project",
    "mqgate.cli.topic",
    "mqgate.cli.producer",
    "mqgate.cli.consumer",
    "mqgate.cli.dlq",
    "mqgate.pipeline.command",  # the Spark extra's command: Spark loads only when it runs
    "mqgate.cli.analytics",
    "mqgate.cli.check",
    "mqgate.cli.user",
    "mqgate.cli.cluster",
    "mqgate.cli.access_key",
)
SERVE: Final = "serve"
JSON_HELP: Final = "print the gateway's answer as JSON instead of text"

# The exit status of a program stopped by SIGPIPE, as a shell reports it.
CLOSED_PIPE = 128 + 13


def build_parser(groups: tuple[str, ...] = COMMAND_GROUPS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mqgate", description=__doc__)
    parser.add_argument("--version", action="version", version=f"mqgate {__version__}")
    parser.add_argument("--json", action="store_true", default=False, help=JSON_HELP)
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="see `mqgate COMMAND --help`"
    )
    for group in groups:
        importlib.import_module(group).add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    serving = bool(argv) and argv[0] == SERVE
    args = build_parser(COMMAND_GROUPS[:1] if serving else COMMAND_GROUPS).parse_args(argv)
    try:
        status = int(args.func(args))
        sys.stdout.flush()  # inside the try: a closed pipe shows here when the output was buffered
        return status
    except MqgateError as exc:
        print(f"mqgate: {exc.message}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`mqgate topic list | head -1`): stop quietly, and point stdout
        # at /dev/null so the interpreter's final flush does not report the pipe again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return CLOSED_PIPE


if __name__ == "__main__":
    raise SystemExit(main())
