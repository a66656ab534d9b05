"""`mqgate topic create|list|grow|delete|browse`."""

from __future__ import annotations

from typing import Any

from mqgate.cli import browse
from mqgate.cli.admin import admin_command, table

TOPIC_COLUMNS = ("name", "project", "queues", "retentionMs", "retentionBytes", "maxPriority")


def add_parser(commands: Any) -> None:
    actions = commands.add_parser("topic", help="create and list topics").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    create = actions.add_parser("create", help="create a topic")
    create.add_argument("name", help="topic name: letters, digits, '.', '_', '-'")
    create.add_argument("--queues", type=int, help="how many queues (default: the gateway's default_queues)")
    create.add_argument("--retention-ms", type=int, help="how long messages are kept, in ms")
    create.add_argument(
        "--retention-bytes", type=int, help="how many bytes each queue keeps (default: no limit)"
    )
    create.add_argument("--project", help="the project it belongs to (default: default)")
    admin_command(
        create,
        lambda c, a: c.create_topic(
            a.name,
            queues=a.queues,
            retention_ms=a.retention_ms,
            retention_bytes=a.retention_bytes,
            project=a.project,
        ),
        lambda t: [
            f"topic {t['name']} created: {t['queues']} queues, retention {t['retentionMs']} ms, "
            f"{t.get('retentionBytes') or 'unlimited'} bytes per queue, max priority {t['maxPriority']}"
        ],
    )
    listing = actions.add_parser("list", help="list the topics")
    listing.add_argument("--project", help="only this project's topics")
    admin_command(
        listing,
        lambda c, a: c.topics(a.project),
        lambda r: table(r["topics"], TOPIC_COLUMNS, "no topics"),
    )
    grow = actions.add_parser("grow", help="grow a topic or change its retention, live (it never shrinks)")
    grow.add_argument("name", help="topic name")
    grow.add_argument("--queues", type=int, help="queues per priority lane (more than now)")
    grow.add_argument("--max-priority", type=int, help="highest priority lane (higher than now)")
    grow.add_argument("--retention-ms", type=int, help="how long messages are kept, in ms")
    grow.add_argument("--retention-bytes", type=int, help="how many bytes each queue keeps (0: no limit)")
    admin_command(
        grow,
        lambda c, a: c.change_topic(
            a.name,
            queues=a.queues,
            max_priority=a.max_priority,
            retention_ms=a.retention_ms,
            retention_bytes=a.retention_bytes,
        ),
        lambda t: [
            f"topic {t['name']}: {t['queues']} queues per lane, max priority {t['maxPriority']}, "
            f"retention {t['retentionMs']} ms, {t.get('retentionBytes') or 'unlimited'} bytes per queue"
        ],
    )
    delete_command(actions, "topic", "and every message in it (refused while producers or consumers use it)")
    browse.add_actions(actions)


def delete_command(actions: Any, kind: str, what: str) -> Any:
    """`mqgate topic|producer|consumer delete NAME`."""
    delete = actions.add_parser("delete", help=f"delete a {kind} {what}")
    delete.add_argument("name", help=f"{kind} name")
    if kind == "consumer":
        delete.add_argument("--keep-dead-letters", action="store_true", help="keep its dead-letter topic")
    admin_command(
        delete,
        lambda c, a: c.delete(kind, a.name, keep_dead_letters=getattr(a, "keep_dead_letters", False)),
        lambda r: [f"{kind} {r['name']} deleted"],
    )
    return delete
