"""`mqgate topic create|list|browse`."""

from __future__ import annotations

from typing import Any

from mqgate.cli import browse
from mqgate.cli.admin import admin_command, table

TOPIC_COLUMNS = ("name", "queues", "retentionMs", "retentionBytes", "maxPriority")


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
    admin_command(
        create,
        lambda c, a: c.create_topic(
            a.name, queues=a.queues, retention_ms=a.retention_ms, retention_bytes=a.retention_bytes
        ),
        lambda t: [
            f"topic {t['name']} created: {t['queues']} queues, retention {t['retentionMs']} ms, "
            f"{t.get('retentionBytes') or 'unlimited'} bytes per queue, max priority {t['maxPriority']}"
        ],
    )
    admin_command(
        actions.add_parser("list", help="list the topics"),
        lambda c, a: c.topics(),
        lambda r: table(r["topics"], TOPIC_COLUMNS, "no topics"),
    )
    browse.add_actions(actions)
