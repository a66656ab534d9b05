"""`mqgate dlq show|browse|redrive`: a consumer's dead letters (docs/PROTOCOL.md, "Dead letters")."""

from __future__ import annotations

from typing import Any

from mqgate.cli.admin import admin_command
from mqgate.names import dlq_topic


def add_parser(commands: Any) -> None:
    actions = commands.add_parser("dlq", help="a consumer's dead letters").add_subparsers(
        dest="action", required=True
    )
    show = actions.add_parser("show", help="offsets, redrive position and copies made so far")
    show.add_argument("consumer", help="the consumer whose dead letters these are")
    admin_command(show, lambda c, a: c.dead_letters(a.consumer))

    browse = actions.add_parser("browse", help="read dead letters without consuming them")
    browse.add_argument("consumer", help="the consumer whose dead letters these are")
    browse.add_argument("--offset", type=int, help="first offset (default: the oldest stored)")
    browse.add_argument("--max", type=int, help="records returned at most (default 100)")
    admin_command(browse, lambda c, a: c.browse(dlq_topic(a.consumer), 0, offset=a.offset, max_count=a.max))

    redrive = actions.add_parser(
        "redrive",
        help="copy dead letters back to their original topic, each at most once",
        description="Choose one dead letter (--offset or --message-id), a filter (any of --reason, "
        "--key, --since, --until) or --all. Filters and --all scan at most --max dead letters from "
        "the redrive position; run again to go on.",
    )
    redrive.add_argument("consumer", help="the consumer whose dead letters go back to its topic")
    one = redrive.add_mutually_exclusive_group()
    one.add_argument("--offset", type=int, help="the dead letter at this offset of the DLQ")
    one.add_argument("--message-id", help="the dead letter with this message id")
    one.add_argument("--all", action="store_true", help="every dead letter")
    redrive.add_argument("--reason", help="dlq.reason: expired or max_attempts")
    redrive.add_argument("--key", help="dead letters with this key")
    redrive.add_argument("--since", type=int, help="dead-lettered at or after this epoch ms")
    redrive.add_argument("--until", type=int, help="dead-lettered before this epoch ms")
    redrive.add_argument("--max", type=int, help="dead letters scanned at most (default 1,000)")
    admin_command(
        redrive,
        lambda c, a: c.redrive(
            a.consumer,
            offset=a.offset,
            message_id=a.message_id,
            reason=a.reason,
            key=a.key,
            since=a.since,
            until=a.until,
            everything=a.all,
            scan=a.max,
        ),
    )
