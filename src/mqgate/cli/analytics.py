"""`mqgate analytics --gateway URL [--project NAME] --out DIR [--from T --to T] [--master URL]`.

Reads the trace topics incrementally into a Parquet dataset under DIR and writes
DIR/report.html and DIR/report.json (docs/ANALYTICS.md). The options are checked, and the
gateway asked which projects are traced, before Spark is imported.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from pathlib import Path
from typing import Any

import msgspec

from mqgate.errors import BadRequest, MqgateError


def parse_time(text: str, option: str) -> int:
    """Epoch milliseconds, or an ISO 8601 date or time (UTC unless it names a zone)."""
    value = text.strip()
    if value.isdigit():
        return int(value)
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise BadRequest(
            f"{option} {text!r} is neither epoch milliseconds nor an ISO 8601 time (2026-01-05T20:00Z)",
            field=option,
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return int(parsed.timestamp() * 1000)


def add_parser(commands: Any) -> None:
    p = commands.add_parser(
        "analytics",
        help="trace analytics on Spark: counts, rates, capacity, latency, errors (docs/ANALYTICS.md)",
    )
    p.add_argument(
        "--gateway",
        default=os.environ.get("MQGATE_URL", "http://127.0.0.1:8080"),
        help="the gateway whose trace topics are read (default: $MQGATE_URL or http://127.0.0.1:8080)",
    )
    p.add_argument(
        "--admin-token", help="default: $MQGATE_ADMIN_TOKEN, else admin.token in $MQGATE_DATA_DIR or ./data"
    )
    p.add_argument("--project", help="one project (default: every traced project)")
    p.add_argument("--out", required=True, type=Path, help="folder of the Parquet dataset and the report")
    p.add_argument("--from", dest="from_", metavar="TIME", help="window start: ISO 8601 (UTC) or epoch ms")
    p.add_argument("--to", metavar="TIME", help="window end (exclusive)")
    p.add_argument("--master", help="Spark master URL (default local[*])")
    p.add_argument(
        "--topic", action="append", help="read this topic instead of the trace topics (repeatable)"
    )
    p.add_argument("--top", type=int, default=10, help="entries in each error table (default 10)")
    p.add_argument("--slowest", type=int, default=20, help="slowest messages listed (default 20)")
    p.add_argument(
        "--report-only", action="store_true", help="read nothing new: report from the dataset in --out"
    )
    p.add_argument(
        "--queue-state-url",
        help="the queue state history for the queue fault timeline: the gateway's "
        "<data_dir>/queue-state.sqlite or the registry's PostgreSQL URL (default: the gateway's API, "
        "which gives queue intervals only)",
    )
    p.add_argument("--queue-state-prefix", default="mqgate_qstate_", help="its table prefix")
    p.add_argument(
        "--threshold",
        action="append",
        metavar="NAME=VALUE",
        help="a health rule threshold for the timeline (docs/QUEUE_STATE.md), e.g. silent_after_ms=60000",
    )
    p.set_defaults(func=run)


def parse_thresholds(items: list[str] | None) -> Any:
    """`NAME=VALUE` items over the health rules' defaults (mqgate.queuestate.diagnosis.Thresholds)."""

    from mqgate.queuestate.diagnosis import Thresholds

    defaults = Thresholds()
    known = {f.name for f in msgspec.structs.fields(Thresholds)}
    changes: dict[str, Any] = {}
    for item in items or []:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or name not in known:
            raise BadRequest(
                f"--threshold {item!r}: give NAME=VALUE, NAME one of {', '.join(sorted(known))}",
                field="--threshold",
            )
        default = getattr(defaults, name)
        try:
            if isinstance(default, frozenset):
                value: Any = frozenset(v.strip() for v in text.split(",") if v.strip())
            else:
                value = type(default)(text)
        except ValueError:
            raise BadRequest(f"--threshold {name}: {text!r} is not a number", field="--threshold") from None
        if not isinstance(value, frozenset) and value <= 0:
            raise BadRequest(f"--threshold {name} must be positive", field="--threshold")
        changes[name] = value
    return msgspec.structs.replace(defaults, **changes)


def options(args: argparse.Namespace) -> Any:
    from mqgate.analytics.job import AnalyticsOptions
    from mqgate.analytics.reports import Window
    from mqgate.cli.admin import admin_token

    start = parse_time(args.from_, "--from") if args.from_ else None
    end = parse_time(args.to, "--to") if args.to else None
    if start is not None and end is not None and end <= start:
        raise BadRequest("--to must be after --from", field="--to")
    for name in ("top", "slowest"):
        if not 1 <= getattr(args, name) <= 1000:
            raise BadRequest(f"--{name} must be between 1 and 1000", field=f"--{name}")
    return AnalyticsOptions(
        out=args.out,
        gateway=None if args.report_only else args.gateway,
        token="" if args.report_only else admin_token(args),
        window=Window(start, end, args.project),
        master=args.master,
        topics=args.topic,
        top_n=args.top,
        slowest=args.slowest,
        queue_state_url=args.queue_state_url,
        queue_state_prefix=args.queue_state_prefix,
        thresholds=parse_thresholds(args.threshold),
    )


def run(args: argparse.Namespace) -> int:
    import logging

    opts = options(args)
    from mqgate.analytics.job import run_analytics  # no Spark yet: it starts inside

    logging.getLogger("py4j").setLevel(logging.WARNING)
    summary = run_analytics(opts)
    counts = summary.report["counts"]["total"]
    print(
        f"analytics: read {summary.events_read} events ({summary.malformed_read} malformed) in "
        f"{summary.ingest_s:.1f}s; report over {counts['events']} events in {summary.report_s:.1f}s: "
        f"produced {counts['produced']}, acked {counts['acked']}, failed {counts['failed']}, "
        f"findings {len(summary.report['findings'])}",
        file=sys.stderr,
    )
    faults = summary.report.get("queueFaults")
    for project, tl in (faults or {}).get("projects", {}).items():
        t = tl["totals"]
        print(
            f"analytics: queue state of {project}: {t['intervals']} intervals, {t['queueFault']} queue "
            f"fault, {t['consumerFault']} consumer fault, {t['queueAndConsumerFault']} both, "
            f"{t['noData']} no data",
            file=sys.stderr,
        )
    for note in [*summary.report["notes"], *(faults or {}).get("notes", [])]:
        print(f"analytics: {note}", file=sys.stderr)
    print(summary.html)
    print(summary.json)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`mqgate analytics ...` on its own (tests, and until the command list has it)."""
    parser = argparse.ArgumentParser(prog="mqgate")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["analytics", *(argv if argv is not None else sys.argv[1:])])
    try:
        return int(args.func(args))
    except MqgateError as exc:
        print(f"mqgate: {exc.message}", file=sys.stderr)
        return 2
