"""`mqgate consumer register|progress|reset|pause|resume|rate-limit|alert|set|token|delete`,
`mqgate alerts`."""

from __future__ import annotations

from typing import Any

from mqgate.cli.admin import admin_command, table
from mqgate.cli.producer import token_command
from mqgate.cli.topic import delete_command

# `mqgate alerts` exits with this status while a backlog alert is active, so a cron job or a
# monitoring check can act on it without parsing the output.
ALERTING = 3

QUEUE_COLUMNS = ("client", "queue", "min", "max", "committed", "lag", "locked", "attempts")
ALERT_COLUMNS = ("consumer", "topic", "lag", "threshold")


def add_parser(commands: Any) -> None:
    actions = commands.add_parser("consumer", help="register and operate consumers").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    register = actions.add_parser("register", help="register a consumer on a topic and print its token")
    register.add_argument("name", help="consumer name")
    register.add_argument("--topic", required=True, help="the topic it reads")
    register.add_argument(
        "--mode",
        choices=["cluster", "broadcast"],
        help="cluster: each message to one client (default); broadcast: to every clientId",
    )
    register.add_argument("--start", help="where it starts: earliest (default), latest or epoch ms")
    register.add_argument("--lock-timeout-s", type=float, help="seconds a pulled batch stays locked unacked")
    register.add_argument("--max-attempts", type=int, help="deliveries before a message is dead-lettered")
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
        lambda r: [
            f"consumer {r['name']} registered on topic {r['topic']} ({r['mode']}, from {r['start']})",
            f"token: {r['token']}",
            "(the gateway keeps only a hash of the token: store it now)",
        ],
    )

    progress = actions.add_parser("progress", help="per-queue offsets, lag and locks of a consumer")
    progress.add_argument("name", help="consumer name")
    admin_command(progress, lambda c, a: c.progress(a.name), progress_text)

    reset = actions.add_parser("reset", help="move a consumer's committed offsets (re-consume or skip)")
    reset.add_argument("name", help="consumer name")
    reset.add_argument(
        "--to",
        required=True,
        choices=["earliest", "latest", "offset", "timestamp"],
        help="the oldest kept message, the end, --offset or the first message at --timestamp",
    )
    reset.add_argument(
        "--offset", type=int, help="with --to offset: the offset (clamped to each queue's bounds)"
    )
    reset.add_argument("--timestamp", type=int, help="with --to timestamp: epoch ms")
    reset.add_argument("--queue", type=int, help="only this queue (default: every queue)")
    reset.add_argument("--client-id", help="broadcast consumers: only this clientId (default: every one)")
    admin_command(
        reset,
        lambda c, a: c.reset_consumer(
            a.name, a.to, offset=a.offset, timestamp=a.timestamp, queue=a.queue, client_id=a.client_id
        ),
        reset_text,
    )

    pause = actions.add_parser("pause", help="stop deliveries to a consumer")
    pause.add_argument("name", help="consumer name")
    admin_command(pause, lambda c, a: c.pause_consumer(a.name), lambda r: [f"consumer {r['name']} paused"])
    resume = actions.add_parser("resume", help="resume deliveries to a paused consumer")
    resume.add_argument("name", help="consumer name")
    admin_command(resume, lambda c, a: c.resume_consumer(a.name), lambda r: [f"consumer {r['name']} resumed"])

    rate = actions.add_parser("rate-limit", help="limit the messages per second a consumer is given")
    rate.add_argument("name", help="consumer name")
    rate.add_argument("messages_per_second", type=float, help="messages per second, 0 = unlimited")
    admin_command(rate, lambda c, a: c.set_rate_limit(a.name, a.messages_per_second), rate_text)

    alert = actions.add_parser("alert", help="alert when a consumer's lag is above a backlog")
    alert.add_argument("name", help="consumer name")
    alert.add_argument("backlog", type=int, help="messages of lag above which the alert is active, 0 = off")
    admin_command(alert, lambda c, a: c.set_alert(a.name, a.backlog), alert_text)

    change = actions.add_parser("set", help="change a consumer's lock timeout or max attempts")
    change.add_argument("name", help="consumer name")
    change.add_argument("--lock-timeout-s", type=float, help="seconds a pulled batch stays locked unacked")
    change.add_argument("--max-attempts", type=int, help="deliveries before a message is dead-lettered")
    admin_command(
        change,
        lambda c, a: c.change_consumer(a.name, lock_timeout_s=a.lock_timeout_s, max_attempts=a.max_attempts),
        lambda r: [
            f"consumer {r['name']}: lock timeout {r['lockTimeoutS']:g} s, max attempts {r['maxAttempts']}"
        ],
    )
    token_command(actions, "consumer")
    delete_command(actions, "consumer", "with its offsets, retry queue, inbox and dead letters")

    alerts = commands.add_parser(
        "alerts", help=f"active backlog alerts (exit status {ALERTING} while one is active, else 0)"
    )
    admin_command(alerts, lambda c, a: c.alerts(), alerts_text, lambda r: ALERTING if r["alerts"] else 0)


def progress_text(p: dict[str, Any]) -> list[str]:
    head = (
        f"consumer {p['consumer']} on {p['topic']} ({p['mode']}{', paused' if p['paused'] else ''}): "
        f"lag {p['lag']}, dead-lettered {p['deadLettered']}"
    )
    # The retry queue and inbox rows are named by their topic (their queue 0 is not the topic's).
    rows = [
        {**q, "client": q.get("clientId"), "queue": q["queue"] if q["source"] == p["topic"] else q["source"]}
        for q in p["queues"]
    ]
    return [head, *table(rows, QUEUE_COLUMNS, "no queues")]


def reset_text(r: dict[str, Any]) -> list[str]:
    lines = progress_text(r)
    for c in r.get("clamped", []):
        client = f" of client {c['clientId']}" if c.get("clientId") else ""
        side = f" of {c['source']}" if c.get("source") != r["topic"] else ""
        where = f"queue {c['queue']}{side}{client}"
        lines.append(f"{where}: offset {c['requested']} is outside the queue, reset to {c['offset']}")
    more = r.get("clampedCount", 0) - len(r.get("clamped", []))
    if more > 0:
        lines.append(f"and {more} more queues whose offset was outside the queue")
    return lines


def rate_text(r: dict[str, Any]) -> list[str]:
    limit = r["messagesPerSecond"]
    return [
        f"consumer {r['name']}: " + (f"at most {limit:g} messages per second" if limit else "no rate limit")
    ]


def alert_text(r: dict[str, Any]) -> list[str]:
    backlog = r["backlog"]
    return [f"consumer {r['name']}: " + (f"alert when lag > {backlog}" if backlog else "no backlog alert")]


def alerts_text(r: dict[str, Any]) -> list[str]:
    return table(r["alerts"], ALERT_COLUMNS, "no active alerts")
