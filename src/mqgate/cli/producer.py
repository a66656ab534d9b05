"""`mqgate producer register`."""

from __future__ import annotations

from typing import Any

from mqgate.cli.admin import admin_command


def add_parser(commands: Any) -> None:
    actions = commands.add_parser("producer", help="producers").add_subparsers(dest="action", required=True)
    register = actions.add_parser("register")
    register.add_argument("name")
    register.add_argument("--topic", required=True)
    admin_command(register, lambda c, a: c.register_producer(a.name, a.topic))
