"""`mqgate consumer register|progress|reset|pause|resume|rate-limit|alert` and `mqgate alerts`."""

from __future__ import annotations

import argparse
from typing import Any

from mqgate.cli.admin import admin_command, admin_options, show, with_client
from mqgate.client import Client


def add_parser(commands: Any) -> None:
    actions = commands.add_parser("consumer", help="consumers").add_subparsers(dest="action", required=True)
    register = actions.add_parser("register")
    register.add_argument("name")
    register.add_argument("--topic", required=True)
    register.add_argument("--mode", choices=["cluster", "broadcast"])
    register.add_argument("--start", help="earliest, latest or epoch ms")
    register.add_argument("--lock-timeout-s", type=float)
    register.add_argument("--max-attempts", type=int)
    admin_command(
        register,
        lambda c, a: c.register_consumer(
            a.name,
            a.topic,
            mode=a.mode,
            start=a.start,
            lock_timeout_s=a.lock_timeout_s,
            max_attempts=a.max_attempts,
        ),
    )

    progress = actions.add_parser("progress")
    progress.add_argument("name")
    progress.add_argument("--json", action="store_true")
    admin_options(progress)
    progress.set_defaults(func=_progress)

    reset = actions.add_parser("reset")
    reset.add_argument("name")
    reset.add_argument("--to", required=True, choices=["earliest", "latest", "offset", "timestamp"])
    reset.add_argument("--offset", type=int)
    reset.add_argument("--timestamp", type=int)
    reset.add_argument("--queue", type=int)
    reset.add_argument("--client-id")
    admin_command(
        reset,
        lambda c, a: c.reset_consumer(
            a.name, a.to, offset=a.offset, timestamp=a.timestamp, queue=a.queue, client_id=a.client_id
        ),
    )

    pause = actions.add_parser("pause")
    pause.add_argument("name")
    admin_command(pause, lambda c, a: c.pause_consumer(a.name))
    resume = actions.add_parser("resume")
    resume.add_argument("name")
    admin_command(resume, lambda c, a: c.resume_consumer(a.name))

    rate = actions.add_parser("rate-limit")
    rate.add_argument("name")
    rate.add_argument("messages_per_second", type=float)
    admin_command(rate, lambda c, a: c.set_rate_limit(a.name, a.messages_per_second))

    alert = actions.add_parser("alert")
    alert.add_argument("name")
    alert.add_argument("backlog", type=int)
    admin_command(alert, lambda c, a: c.set_alert(a.name, a.backlog))

    admin_command(commands.add_parser("alerts", help="active backlog alerts"), lambda c, a: c.alerts())


def _progress(args: argparse.Namespace) -> int:
    return with_client(args, lambda client: _show_progress(client, args.name, args.json))


def _show_progress(client: Client, consumer: str, as_json: bool) -> int:
    p = client.progress(consumer)
    if as_json:
        return show(p)
    print(
        f"consumer {p['consumer']} on {p['topic']} ({p['mode']}{', paused' if p['paused'] else ''}): "
        f"lag {p['lag']}, dead-lettered {p['deadLettered']}"
    )
    print(
        f"{'client':<16}{'queue':>6}{'min':>12}{'max':>12}{'committed':>12}{'lag':>10}{'locked':>8}{'attempts':>9}"
    )
    for q in p["queues"]:
        print(
            f"{(q['clientId'] or '-'):<16}{q['queue']:>6}{q['min']:>12}{q['max']:>12}{q['committed']:>12}"
            f"{q['lag']:>10}{('yes' if q['locked'] else 'no'):>8}{q['attempts']:>9}"
        )
    return 0
