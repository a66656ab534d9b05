"""`mqgate project create|list|show|delete|health` and `mqgate trace policy|find` (SPEC P1-P6)."""

from __future__ import annotations

from typing import Any

from mqgate.cli.admin import admin_command, table

MODES = ("project", "route", "queue", "service")
LEVELS = ("info", "error", "debug")
POLICY_COLUMNS = ("id", "mode", "level", "project", "topic", "queue", "service")


def named_topics(project: dict[str, Any]) -> str:
    """Its topics as the answer names them, and how many more there are (`topic list --project`)."""
    shown = ",".join(project["topics"])
    more = project.get("topicCount", len(project["topics"])) - len(project["topics"])
    return f"{shown} and {more} more" if more > 0 else shown


def add_parser(commands: Any) -> None:
    actions = commands.add_parser("project", help="projects: groups of related services").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    create = actions.add_parser("create", help="create a project")
    create.add_argument("name", help="project name")
    create.add_argument("--description", default="", help="what the project is")
    admin_command(
        create,
        lambda c, a: c.call("POST", "/admin/projects", {"name": a.name, "description": a.description}),
        lambda p: [f"project {p['name']} created"],
    )
    admin_command(
        actions.add_parser("list", help="list projects and their topics"),
        lambda c, a: c.projects(),
        lambda r: table(
            [{**p, "topics": named_topics(p)} for p in r["projects"]],
            ("name", "description", "topics"),
            "no projects",
        ),
    )
    show = actions.add_parser("show", help="show a project")
    show.add_argument("name", help="project name")
    admin_command(show, lambda c, a: c.call("GET", f"/admin/projects/{a.name}"))
    health = actions.add_parser("health", help="a project's health: a queue fault or a consumer fault")
    health.add_argument("name", help="project name")
    admin_command(health, lambda c, a: c.listing(f"/admin/projects/{a.name}/health", "findings"))
    delete = actions.add_parser("delete", help="delete an empty project")
    delete.add_argument("name", help="project name")
    admin_command(
        delete,
        lambda c, a: c.delete("project", a.name),
        lambda r: [f"project {r['name']} deleted"],
    )
    add_trace_parser(commands)


def add_trace_parser(commands: Any) -> None:
    actions = commands.add_parser("trace", help="trace policies and message paths").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    add = actions.add_parser("add", help="add a trace policy")
    add.add_argument("mode", choices=MODES, help="what the policy selects")
    add.add_argument("--level", default="info", choices=LEVELS, help="the detail recorded")
    add.add_argument("--project", help="the project (mode project)")
    add.add_argument("--topic", help="the topic (modes route and queue)")
    add.add_argument("--queue", type=int, help="the store queue (mode queue)")
    add.add_argument("--service", help="a producer or consumer name (mode service)")

    def policy(a: Any) -> dict[str, Any]:
        body = {"mode": a.mode, "level": a.level, "project": a.project, "topic": a.topic}
        body.update(queue=a.queue, service=a.service)
        return {k: v for k, v in body.items() if v is not None}

    admin_command(
        add, lambda c, a: c.call("POST", "/admin/trace-policies", policy(a)), lambda p: [f"policy {p['id']}"]
    )
    admin_command(
        actions.add_parser("policies", help="list trace policies"),
        lambda c, a: c.trace_policies(),
        lambda r: table(r["policies"], POLICY_COLUMNS, "no policies"),
    )
    remove = actions.add_parser("remove", help="delete a trace policy")
    remove.add_argument("id", help="the policy id")
    admin_command(
        remove,
        lambda c, a: c.call("DELETE", f"/admin/trace-policies/{a.id}"),
        lambda r: [f"policy {r['name']} deleted"],
    )
    find = actions.add_parser("find", help="a message's full path")
    which = find.add_mutually_exclusive_group(required=True)
    which.add_argument("--msg-id", help="the message id of a receipt")
    which.add_argument("--request-id", help="the requestId of a pull")
    which.add_argument("--key", help="a message key")

    def params(a: Any) -> dict[str, str]:
        given = {"msgId": a.msg_id, "requestId": a.request_id, "key": a.key}
        return {k: v for k, v in given.items() if v is not None}

    admin_command(find, lambda c, a: c.call("GET", "/admin/traces", params=params(a)), render_paths)


def render_paths(result: dict[str, Any]) -> list[str]:
    lines = []
    for path in result["paths"]:
        lines.append(f"message {path['msgId']} ({path['project']}/{path['topic']}, keys {path['keys']})")
        for hop in path["hops"]:
            queue = hop.get("source") or f"queue {hop.get('queue')}"
            where = f"{queue} offset {hop['offset']}" if "offset" in hop else ""
            who = hop.get("consumer") or hop.get("producer") or ""
            fail = (
                f" FAILED: {hop['failure']['cause']} at {hop['failure']['node']}" if "failure" in hop else ""
            )
            gap = f"+{hop['latencyMs']} ms" if "latencyMs" in hop else ""
            lines.append(
                f"  {hop['hop']:<14} {gap:>10}  {who} {where} on {hop['resource']['gatewayId']}{fail}"
            )
        for state in path["consumers"]:
            lines.append(f"  consumer {state['consumer']}: {state['state']}")
    if result["mayBeIncomplete"]:
        lines.append(f"(the index is {result['indexLagEvents']} events behind: the path may be incomplete)")
    return lines or ["no traced message found"]
