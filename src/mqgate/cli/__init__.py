"""`mqgate`: run a gateway, and administer one over its HTTP admin API."""

from __future__ import annotations

import argparse
import sys

from mqgate.cli import consumer, dlq, pipeline, producer, serve, topic
from mqgate.errors import MqgateError

# Each module adds its command group; none imports more than argparse and mqgate.client until
# its command runs, so `mqgate --help` and the admin commands stay light.
COMMAND_GROUPS = (serve, topic, producer, consumer, dlq, pipeline)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mqgate", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except MqgateError as exc:
        print(f"mqgate: {exc.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
