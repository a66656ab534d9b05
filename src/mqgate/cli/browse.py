"""`mqgate topic browse`: a store queue's records by offset, time, key or message id, without
consuming (GET /mq/browse)."""

from __future__ import annotations

from typing import Any

from mqgate.cli.admin import admin_command


def add_actions(actions: Any) -> None:
    """Adds `browse` to the `topic` command group's actions."""
    browse = actions.add_parser(
        "browse",
        help="read a queue without consuming: from an offset or a time, or search a key or message id",
        description="Queues are store queues: lane p of a topic with N queues holds queues p*N .. p*N+N-1, "
        "the numbers receipts and pulls show.",
    )
    browse.add_argument("topic", help="a topic, or a consumer's dead letters: %%DLQ%%<consumer>")
    browse.add_argument("--queue", type=int, default=0, help="store queue (default 0)")
    start = browse.add_mutually_exclusive_group()
    start.add_argument("--offset", type=int, help="first offset (default: the oldest stored)")
    start.add_argument("--timestamp", type=int, help="from the first record at or after this epoch ms")
    search = browse.add_mutually_exclusive_group()
    search.add_argument("--key", help="only records with this key")
    search.add_argument("--message-id", help="the record with this message id")
    browse.add_argument("--max", type=int, help="records returned at most (default 100)")
    browse.add_argument(
        "--scan", type=int, help="records a key or message-id search reads at most (default 10,000)"
    )
    admin_command(
        browse,
        lambda c, a: c.browse(
            a.topic,
            a.queue,
            offset=a.offset,
            timestamp=a.timestamp,
            key=a.key,
            message_id=a.message_id,
            max_count=a.max,
            scan=a.scan,
        ),
    )
