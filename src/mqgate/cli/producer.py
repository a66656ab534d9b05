"""`mqgate producer register`."""

from __future__ import annotations

from typing import Any

from mqgate.cli.admin import admin_command


def add_parser(commands: Any) -> None:
    actions = commands.add_parser("producer", help="register producers").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    register = actions.add_parser("register", help="register a producer on a topic and print its token")
    register.add_argument("name", help="producer name")
    register.add_argument("--topic", required=True, help="the topic it writes to")
    admin_command(
        register,
        lambda c, a: c.register_producer(a.name, a.topic),
        lambda p: [
            f"producer {p['name']} registered on topic {p['topic']}",
            f"token: {p['token']}",
            "(the gateway keeps only a hash of the token: store it now)",
        ],
    )
