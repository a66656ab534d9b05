"""`mqgate`: run a gateway, and administer one over its HTTP admin API."""

from __future__ import annotations

import argparse
import os
import sys

from mqgate import __version__
from mqgate.cli import (
    analytics,
    check,
    cluster,
    consumer,
    dlq,
    producer,
    project,
    serve,
    topic,
    user,
)
from mqgate.cli.admin import JSON_HELP
from mqgate.errors import MqgateError
from mqgate.pipeline import command as pipeline  # the Spark extra's command: Spark loads only when it runs

# Each module adds its command group; none imports more than argparse and mqgate.client until
# its command runs, so `mqgate --help` and the admin commands stay light.
COMMAND_GROUPS = (serve, project, topic, producer, consumer, dlq, pipeline, analytics, check, user, cluster)

# The exit status of a program stopped by SIGPIPE, as a shell reports it.
CLOSED_PIPE = 128 + 13


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mqgate", description=__doc__)
    parser.add_argument("--version", action="version", version=f"mqgate {__version__}")
    parser.add_argument("--json", action="store_true", default=False, help=JSON_HELP)
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="see `mqgate COMMAND --help`"
    )
    for group in COMMAND_GROUPS:
        group.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
