"""`mqgate pipeline run <config.toml> [--master URL] [--available-now]`.

The config is checked before Spark is imported: a mistake in it is reported at once, and
`mqgate --help` never loads Spark.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from mqgate.errors import MqgateError


def add_parser(commands: Any) -> None:
    pipeline = commands.add_parser("pipeline", help="the event pipeline on Spark (docs/PIPELINE.md)")
    actions = pipeline.add_subparsers(dest="action", required=True)
    run_parser = actions.add_parser("run", help="run the pipeline of a TOML file")
    run_parser.add_argument("config", help="pipeline TOML file (see examples/pipeline/)")
    run_parser.add_argument("--master", help="Spark master URL (default local[*])")
    run_parser.add_argument(
        "--available-now",
        action="store_true",
        help="process what is in the topics now (and the hot and retry paths it leads to), then stop",
    )
    run_parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mqgate.pipeline.config import load_config

    config = load_config(Path(args.config))
    from mqgate.pipeline.job import run_pipeline  # imports Spark: only for a valid config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        logging.getLogger("mqgate.pipeline").info("signal %d: stopping after the running batches", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    summary = run_pipeline(config, master=args.master, available_now=args.available_now, stop=stop)
    r = summary.report
    print(
        f"pipeline {config.job.name}: {summary.batches} batches, {r.events} events "
        f"in {summary.seconds:.1f}s: "
        f"applied {r.applied}, duplicates {r.duplicates}, to hot {r.moved_hot}, retried {r.retried}, "
        f"dead {r.dead + r.parse_failures}, flushed {summary.flushed}",
        file=sys.stderr,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m mqgate.pipeline run ...`: the same as `mqgate pipeline run ...`."""
    parser = argparse.ArgumentParser(prog="python -m mqgate.pipeline")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["pipeline", *(argv if argv is not None else sys.argv[1:])])
    try:
        return int(args.func(args))
    except MqgateError as exc:
        print(f"mqgate: {exc.message}", file=sys.stderr)
        return 2
