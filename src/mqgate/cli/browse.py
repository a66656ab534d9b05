"""`mqgate topic browse`: a store queue's records by offset, time, key or message id, without
consuming (GET /mq/browse)."""

from __future__ import annotations

import argparse
from typing import Any

from mqgate.cli.admin import admin_command
from mqgate.client import Client


def add_actions(actions: Any) -> None:
    """Adds `browse` to the `topic` command group's actions."""
    browse = actions.add_parser(
        "browse",
        help="read a queue without consuming: from an offset or a time, or search a key or message id",
        description="Queues are store queues: lane p of a topic with N queues holds queues p*N .. p*N+N-1, "
        "the numbers receipts and pulls show.",
    )
    browse.add_argument("topic", help="a topic, or a consumer's dead letters: %%DLQ%%<consumer>")
    browse.add_argument(
        "--queue",
        type=int,
        help="store queue (default: 0; a --key or --message-id search: every queue of the topic)",
    )
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
    admin_command(browse, run)


def run(c: Client, a: argparse.Namespace) -> Any:
    """One queue's page; a search that names no queue searches each queue of the topic in
    turn (each up to --scan records) until it has --max records (one for a message id), and
    each record says which queue it is in."""

    def page(queue: int) -> Any:
        return c.browse(
            a.topic,
            queue,
            offset=a.offset,
            timestamp=a.timestamp,
            key=a.key,
            message_id=a.message_id,
            max_count=a.max,
            scan=a.scan,
        )

    if a.queue is not None or (a.key is None and a.message_id is None):
        return page(a.queue or 0)
    wanted = 1 if a.message_id is not None else (a.max or 100)
    found: list[Any] = []
    searched: list[dict[str, int]] = []
    scan_limit = 0
    for b in c.bounds(a.topic)[1]:
        got = page(b.queue)
        found += [{**m, "queue": b.queue} for m in got["msgList"]]
        searched.append({"queue": b.queue, "scanned": got["scanned"], "next": got["next"]})
        scan_limit = got["scanLimit"]
        if len(found) >= wanted:
            break
    scanned = sum(q["scanned"] for q in searched)
    return {"msgList": found[:wanted], "scanned": scanned, "scanLimit": scan_limit, "queues": searched}
