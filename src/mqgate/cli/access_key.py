"""`mqgate access-key create|list|revoke`: the keys AWS SDKs sign SQS requests with (issue 30)."""

from __future__ import annotations

from typing import Any

from mqgate.cli.admin import admin_command, table

KEY_COLUMNS = ("name", "project", "accessKeyId", "account", "createdMs", "revokedMs")


def add_parser(commands: Any) -> None:
    actions = commands.add_parser(
        "access-key", help="access keys for the SQS API (AWS SDKs, the AWS CLI)"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="issue an access key to a project (its secret is shown once)")
    create.add_argument("name", help="key name: letters, digits, '.', '_', '-'")
    create.add_argument("--project", required=True, help="the project whose queues it reaches")
    admin_command(
        create,
        lambda c, a: c.call(
            "POST",
            "/admin/access-keys",
            {"name": a.name, "project": a.project},
            what=f"creating access key {a.name}",
        ),
        lambda k: [
            f"access key {k['name']} created for project {k['project']} (account {k['account']})",
            f"aws_access_key_id = {k['accessKeyId']}",
            f"aws_secret_access_key = {k['secretAccessKey']}",
            "the secret is shown this once: keep it now",
        ],
    )
    listing = actions.add_parser("list", help="list access keys (never their secrets)")
    listing.add_argument("--project", help="only this project's keys")
    admin_command(
        listing,
        lambda c, a: c.listing(
            "/admin/access-keys",
            "accessKeys",
            params={} if a.project is None else {"project": a.project},
            what="listing access keys",
        ),
        lambda r: table(r["accessKeys"], KEY_COLUMNS, "no access keys"),
    )
    revoke = actions.add_parser("revoke", help="revoke an access key: its signatures are refused from now on")
    revoke.add_argument("name", help="key name")
    admin_command(
        revoke,
        lambda c, a: c.call("DELETE", f"/admin/access-keys/{a.name}", what=f"revoking access key {a.name}"),
        lambda k: [f"access key {k['name']} ({k['accessKeyId']}) revoked"],
    )
