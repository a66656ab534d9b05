"""What the administration commands share: the gateway's URL and admin token, one client,
and how answers and failures are shown."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mqgate.client import UNREACHABLE, Client
from mqgate.errors import MqgateError

# Exit statuses: the gateway refused the call, or gave no answer at all.
REFUSED = 1
UNREACHED = 2


def admin_options(parser: argparse.ArgumentParser) -> None:
    """The options naming the gateway and the admin token (read by `with_client`)."""
    parser.add_argument("--url", default=os.environ.get("MQGATE_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--admin-token")


def admin_command(parser: argparse.ArgumentParser, call: Callable[[Client, argparse.Namespace], Any]) -> None:
    """A command printing, as JSON, the result of `call` on a client of the gateway."""
    admin_options(parser)
    parser.set_defaults(func=lambda args: with_client(args, lambda c: show(call(c, args))))


def show(result: Any) -> int:
    print(json.dumps(result, indent=2))
    return 0


def with_client(args: argparse.Namespace, run: Callable[[Client], int]) -> int:
    """`run` on a client of the gateway; a failed call is reported on stderr, its exit status
    REFUSED or UNREACHED."""
    with Client(args.url, admin_token(args), timeout_s=30.0) as client:
        try:
            return run(client)
        except MqgateError as exc:
            print(f"mqgate: {exc.message}", file=sys.stderr)
            return UNREACHED if exc.code == UNREACHABLE else REFUSED


def admin_token(args: argparse.Namespace) -> str:
    if args.admin_token:
        return str(args.admin_token)
    env = os.environ.get("MQGATE_ADMIN_TOKEN")
    if env:
        return env
    path = Path(os.environ.get("MQGATE_DATA_DIR", "data")) / "admin.token"
    if path.exists():
        return path.read_text().strip()
    raise SystemExit("no admin token: pass --admin-token or set MQGATE_ADMIN_TOKEN")
