"""`mqgate producer register|list|token|delete`."""

from __future__ import annotations

from typing import Any

from mqgate.cli.admin import admin_command, table
from mqgate.cli.topic import delete_command


def add_parser(commands: Any) -> None:
    actions = commands.add_parser("producer", help="register, list and re-key producers").add_subparsers(
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
    listing = actions.add_parser("list", help="list producers (tokens are never shown)")
    admin_command(
        listing,
        lambda c, a: c.producers(),
        lambda r: table(
            [
                {**p, "destinations": ",".join(p["destinations"]), "revoked": p["tokenRevoked"]}
                for p in r["producers"]
            ],
            ("name", "topic", "destinations", "revoked"),
            "no producers",
        ),
    )
    token_command(actions, "producer")
    delete_command(actions, "producer", "(its token is refused from then on; its messages stay)")


def token_command(actions: Any, kind: str) -> None:
    """`mqgate producer|consumer token NAME [--revoke]`."""
    token = actions.add_parser(
        "token", help=f"issue a new token to a {kind} (the old one is refused from then on), or revoke it"
    )
    token.add_argument("name", help=f"{kind} name")
    token.add_argument("--revoke", action="store_true", help="leave it without a valid token")
    admin_command(
        token,
        lambda c, a: c.new_token(kind, a.name, revoke=a.revoke),
        lambda r: (
            [f"{kind} {r['name']}: token revoked"]
            if r["token"] is None
            else [f"{kind} {r['name']}: new token {r['token']}", "(the old token is refused from now on)"]
        ),
    )
