"""`mqgate user add|list|delete|passwd|grant|revoke`: console users, offline.

Works on the registry's database like `mqgate check` works on the data directory: with
--data-dir (the SQLite registry in it) or --registry URL, or the settings of --config and
MQGATE_*. A running gateway sees the change at the next sign-in. Every change is written to
the audit log (via "cli").
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from pathlib import Path
from typing import Any

ROLE_HELP = "admin (every project), owner, member or viewer"


def add_parser(commands: Any) -> None:
    user = commands.add_parser("user", help="console users and their roles (offline)", description=__doc__)
    actions = user.add_subparsers(dest="action", required=True, metavar="ACTION")

    def where(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--config", help="TOML settings file")
        p.add_argument("--data-dir", help="the data directory (its registry.db)")
        p.add_argument("--registry", help="SQLAlchemy URL of the registry, e.g. postgresql+psycopg://...")
        return p

    add = where(actions.add_parser("add", help="add a user"))
    add.add_argument("name", help="the user name")
    add.add_argument("--role", required=True, help=ROLE_HELP)
    add.add_argument("--project", default="*", help="the project the role is for (default: * = every one)")
    add.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    add.set_defaults(func=run_add)
    where(actions.add_parser("list", help="list users and their roles")).set_defaults(func=run_list)
    delete = where(actions.add_parser("delete", help="delete a user and end their sessions"))
    delete.add_argument("name", help="the user name")
    delete.set_defaults(func=run_delete)
    passwd = where(actions.add_parser("passwd", help="set a user's password (ends their sessions)"))
    passwd.add_argument("name", help="the user name")
    passwd.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    passwd.set_defaults(func=run_passwd)
    for verb in ("grant", "revoke"):
        p = where(actions.add_parser(verb, help=f"{verb} a role on a project"))
        p.add_argument("name", help="the user name")
        p.add_argument("--role", required=True, help=ROLE_HELP)
        p.add_argument("--project", default="*", help="the project (default: *)")
        p.set_defaults(func=run_grant if verb == "grant" else run_revoke)


def _engine(args: argparse.Namespace) -> Any:
    from mqgate.console.tables import create_tables, engine_for
    from mqgate.settings import load_settings

    settings = load_settings(
        Path(args.config) if args.config else None, data_dir=args.data_dir, registry=args.registry
    )
    if not settings.registry:
        Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
    engine = engine_for(settings.resolved_registry_url())
    create_tables(engine)
    return engine


def _password(args: argparse.Namespace) -> str:
    if args.password_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    first = getpass.getpass("Password: ")
    if getpass.getpass("Again: ") != first:
        from mqgate.errors import BadRequest

        raise BadRequest("the passwords differ", field="password")
    return first


def _actor() -> str:
    try:
        return "cli:" + (os.environ.get("SUDO_USER") or getpass.getuser())
    except OSError:
        return "cli"


def _audit(engine: Any, action: str, name: str, **kwargs: Any) -> None:
    from mqgate.console.audit import AuditLog

    AuditLog(engine).record(_actor(), action, name, via="cli", **kwargs)


def run_add(args: argparse.Namespace) -> int:
    from mqgate.console.accounts import Accounts

    engine = _engine(args)
    row = Accounts(engine).add(args.name, _password(args), args.role, args.project)
    _audit(engine, "user.add", row.name, after={"grants": [[g.role, g.project] for g in row.grants]})
    print(f"user {row.name} added: {args.role} on {args.project}")
    return 0


def run_list(args: argparse.Namespace) -> int:
    from mqgate.console.accounts import Accounts

    rows = Accounts(_engine(args)).list()
    if not rows:
        print("no users")
    for r in rows:
        roles = ", ".join(f"{g.role}@{g.project}" for g in r.grants) or "no roles"
        print(f"{r.name}\t{r.provider}\t{roles}")
    return 0


def run_delete(args: argparse.Namespace) -> int:
    from mqgate.console.accounts import Accounts

    engine = _engine(args)
    Accounts(engine).delete(args.name)
    _audit(engine, "user.delete", args.name)
    print(f"user {args.name} deleted")
    return 0


def run_passwd(args: argparse.Namespace) -> int:
    from mqgate.console.accounts import Accounts

    engine = _engine(args)
    Accounts(engine).set_password(args.name, _password(args))
    _audit(engine, "user.passwd", args.name)
    print(f"password of {args.name} changed")
    return 0


def _grant(args: argparse.Namespace, revoke: bool) -> int:
    from mqgate.console.accounts import Accounts

    engine = _engine(args)
    accounts = Accounts(engine)
    (accounts.revoke if revoke else accounts.grant)(args.name, args.role, args.project)
    action = "user.revoke" if revoke else "user.grant"
    project = "" if args.project == "*" else args.project
    _audit(engine, action, args.name, project=project, after=[args.role, args.project])
    print(f"{args.name}: {args.role} on {args.project} {'revoked' if revoke else 'granted'}")
    return 0


def run_grant(args: argparse.Namespace) -> int:
    return _grant(args, revoke=False)


def run_revoke(args: argparse.Namespace) -> int:
    return _grant(args, revoke=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m mqgate.cli.user ...`, until `user` is among the `mqgate` command groups."""
    from mqgate.errors import MqgateError

    parser = argparse.ArgumentParser(prog="mqgate")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["user", *(argv if argv is not None else sys.argv[1:])])
    try:
        return int(args.func(args))
    except MqgateError as exc:
        print(f"mqgate: {exc.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
