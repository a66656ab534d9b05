"""`mqgate cluster add|list|show|delete|assign|failover|failback|spool` (SPEC P8, E7)."""

from __future__ import annotations

from typing import Any

from mqgate.cli.admin import admin_command, table

CLUSTER_COLUMNS = ("name", "pool", "state", "url", "reason", "errorRate", "lastProbeLatencyMs")


def add_parser(commands: Any) -> None:
    actions = commands.add_parser(
        "cluster", help="store clusters and each project's primary and backup (failover)"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="add a store cluster to a pool")
    add.add_argument("name", help="cluster name")
    add.add_argument(
        "store_url", metavar="URL", help="redis://host:port/db (or rediss://, unix://, embedded:<dir>)"
    )
    add.add_argument("--pool", default="default", help="the pool it belongs to")
    add.add_argument("--broker", help="its broker name in ack tokens (default: its name)")
    admin_command(
        add,
        lambda c, a: c.call(
            "POST",
            "/admin/clusters",
            {"name": a.name, "url": a.store_url, "pool": a.pool, "broker": a.broker},
        ),
        lambda r: [f"cluster {r['name']} added to pool {r['pool']}: {r['state']}"],
    )
    admin_command(
        actions.add_parser("list", help="clusters and their health"),
        lambda c, a: c.clusters(),
        lambda r: table(r["clusters"], CLUSTER_COLUMNS, "no clusters"),
    )
    show = actions.add_parser("show", help="one cluster's health")
    show.add_argument("name", help="cluster name")
    admin_command(show, lambda c, a: c.call("GET", f"/admin/clusters/{a.name}"))
    delete = actions.add_parser("delete", help="remove a cluster no project uses")
    delete.add_argument("name", help="cluster name")
    admin_command(
        delete,
        lambda c, a: c.call("DELETE", f"/admin/clusters/{a.name}"),
        lambda r: [f"cluster {r['name']} removed"],
    )
    assign = actions.add_parser("assign", help="set a project's primary and backup cluster")
    assign.add_argument("project", help="project name")
    assign.add_argument("--primary", required=True, help="the cluster it normally writes to")
    assign.add_argument("--backup", help="the cluster it moves to when the primary fails")
    assign.add_argument("--auto-failback", action="store_true", help="move back once the primary is healthy")
    admin_command(
        assign,
        lambda c, a: c.call(
            "PUT",
            f"/admin/projects/{a.project}/clusters",
            {"primary": a.primary, "backup": a.backup, "autoFailback": a.auto_failback},
        ),
        _project_lines,
    )
    state = actions.add_parser("failover", help="a project's active cluster and its last switch")
    state.add_argument("project", help="project name")
    admin_command(state, lambda c, a: c.call("GET", f"/admin/projects/{a.project}/failover"), _project_lines)
    back = actions.add_parser("failback", help="move a project back to its primary")
    back.add_argument("project", help="project name")
    admin_command(back, lambda c, a: c.call("POST", f"/admin/projects/{a.project}/failback"), _project_lines)
    admin_command(
        actions.add_parser("spool", help="the gateway's producer spool"),
        lambda c, a: c.call("GET", "/admin/spool"),
    )


def _project_lines(r: dict[str, Any]) -> list[str]:
    lines = [
        f"project {r['project']}: active {r.get('active') or '-'} (primary {r['primary']}, "
        f"backup {r.get('backup') or '-'}, epoch {r.get('epoch', 0)})"
    ]
    if r.get("reason"):
        lines.append(f"last switch: {r['reason']}")
    if r.get("spooled"):
        lines.append(f"{r['spooled']} produces in this gateway's spool")
    if r["draining"]:
        lines.append(f"to drain: {', '.join(r['draining'])}")
    return lines
