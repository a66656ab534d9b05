"""`mqgate topic create|list|browse`."""

from __future__ import annotations

from typing import Any

from mqgate.cli import browse
from mqgate.cli.admin import admin_command


def add_parser(commands: Any) -> None:
    actions = commands.add_parser("topic", help="topics").add_subparsers(dest="action", required=True)
    create = actions.add_parser("create")
    create.add_argument("name")
    create.add_argument("--queues", type=int)
    create.add_argument("--retention-ms", type=int)
    create.add_argument("--retention-bytes", type=int)
    admin_command(
        create,
        lambda c, a: c.create_topic(
            a.name, queues=a.queues, retention_ms=a.retention_ms, retention_bytes=a.retention_bytes
        ),
    )
    admin_command(actions.add_parser("list"), lambda c, a: c.topics())
    browse.add_actions(actions)
