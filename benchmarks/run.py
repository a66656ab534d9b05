#!/usr/bin/env python3
"""mqgate benchmarks: one runner, one subcommand per measurement (benchmarks/README.md).

    python benchmarks/run.py [gateway] [--quick] [--store redis] ...   # the main table (default)
    python benchmarks/run.py trace --what cost|cpu|bytecodes|instructions|phases|lookups|rounds
    python benchmarks/run.py <subcommand> --help

Every run prints its section, appends it to benchmarks/HISTORY.md and rewrites its rows of the
current table in benchmarks/RESULTS.md (`--no-record`: neither). The code is in bench/.
"""

from __future__ import annotations

import argparse
import sys

from bench import (
    aliyun,
    analytics,
    cluster,
    console,
    failover,
    gateway,
    load_edges,
    pipeline,
    push,
    qos,
    redis,
    results,
    scheduler,
    spark_read,
    sqs,
    store,
    trace,
    workers,
)
from bench.procs import stop_on_sigterm

MODULES = (
    gateway,
    trace,
    store,
    redis,
    qos,
    scheduler,
    cluster,
    failover,
    console,
    analytics,
    pipeline,
    spark_read,
    load_edges,
    sqs,
    aliyun,
    push,
    workers,
)


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--no-record",
        "--no-results",
        action="store_true",
        help="print the results only: append nothing to HISTORY.md, leave RESULTS.md as it is",
    )
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", metavar="subcommand", required=True)
    for module in MODULES:
        module.add_parser(sub, common)
    return ap


def main(argv: list[str]) -> int:
    ap = parser()
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["gateway", *argv]  # `run.py [options]` is the main table, as `make bench` runs it
    args = ap.parse_args(argv)
    args.cmdline = results.command_line(argv)
    stop_on_sigterm()
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
