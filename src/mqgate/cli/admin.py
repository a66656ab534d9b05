"""What the administration commands share: the gateway's URL and admin token, one client,
and how answers and failures are shown (text for people, or the gateway's JSON with --json)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mqgate.cli import JSON_HELP
from mqgate.client import UNREACHABLE, Client
from mqgate.errors import MqgateError

# Exit statuses: the gateway refused the call, or gave no answer at all.
REFUSED = 1
UNREACHED = 2

# How a command's result reads as text, and its exit status (0 unless the result says otherwise).
Render = Callable[[Any], Sequence[str]]
Status = Callable[[Any], int]


def json_option(parser: argparse.ArgumentParser) -> None:
    """`--json` after a command too (`mqgate topic list --json`); SUPPRESS keeps a `--json`
    given before the command (`mqgate --json topic list`) from being reset by this default."""
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=JSON_HELP)


def admin_options(parser: argparse.ArgumentParser) -> None:
    """The options naming the gateway and the admin token (read by `with_client`), and --json."""
    parser.add_argument(
        "--url",
        default=os.environ.get("MQGATE_URL", "http://127.0.0.1:8080"),
        help="the gateway's base URL (default: $MQGATE_URL or http://127.0.0.1:8080)",
    )
    parser.add_argument(
        "--admin-token",
        help="the admin token (default: $MQGATE_ADMIN_TOKEN, else admin.token in $MQGATE_DATA_DIR or ./data)",
    )
    json_option(parser)


def admin_command(
    parser: argparse.ArgumentParser,
    call: Callable[[Client, argparse.Namespace], Any],
    render: Render | None = None,
    status: Status | None = None,
) -> None:
    """A command showing the result of `call` on a client of the gateway: `render` (or a
    generic layout) as text, or the JSON result with --json; its exit status from `status`."""
    admin_options(parser)

    def run(args: argparse.Namespace) -> int:
        return with_client(args, lambda client: show(call(client, args), args, render, status))

    parser.set_defaults(func=run)


def show(
    result: Any,
    args: argparse.Namespace | None = None,
    render: Render | None = None,
    status: Status | None = None,
) -> int:
    """Print `result`: as JSON with --json (or without `args`), else as text; the exit status."""
    if args is None or getattr(args, "json", False):
        print(json.dumps(result, indent=2))
    else:
        for line in (render or generic_text)(result):
            print(line)
    return status(result) if status else 0


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


# --- text for people ------------------------------------------------------------------------


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ",".join(cell(v) for v in value) or "-"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str], empty: str) -> list[str]:
    """Rows as aligned columns under a header: numbers right-aligned, text left-aligned."""
    if not rows:
        return [empty]
    cells = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    numeric = [
        all(isinstance(row.get(c), int | float) and not isinstance(row.get(c), bool) for row in rows)
        for c in columns
    ]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    return [line(columns), *(line(r) for r in cells)]


def generic_text(result: Any) -> list[str]:
    """Any result: `key: value` lines, a list of objects as a table."""
    if isinstance(result, dict):
        lines: list[str] = []
        for key, value in result.items():
            if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                lines.append(f"{key}:")
                lines.extend("  " + row for row in table(value, list(value[0]), ""))
            else:
                lines.append(f"{key}: {cell(value)}")
        return lines
    if isinstance(result, list) and all(isinstance(v, dict) for v in result):
        return table(result, list(result[0]) if result else [], "(none)")
    return [cell(result)]
