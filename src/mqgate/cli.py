"""`mqgate`: run a gateway, and administer one over its HTTP admin API."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from mqgate.errors import MqgateError
from mqgate.pipeline.cli import add_parser as add_pipeline_parser
from mqgate.settings import ENV_PREFIX, load_settings

SERVE_FLAGS = ("host", "port", "data_dir", "fsync", "store", "registry", "workers")


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from mqgate.api.app import build_app, prepare

    flags = {name: getattr(args, name) for name in SERVE_FLAGS}
    settings = load_settings(Path(args.config) if args.config else None, **flags)
    prepare(settings)
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "loop": "uvloop",
        "http": "httptools",
        "lifespan": "on",
        "access_log": False,
        "proxy_headers": False,
        "server_header": False,
        "log_level": settings.log_level,
        "timeout_graceful_shutdown": 5,
    }
    if settings.workers == 1:
        uvicorn.run(build_app(settings), **options)
        return 0
    # Worker processes build their app from the environment: hand them the same settings.
    if args.config:
        os.environ[ENV_PREFIX + "CONFIG"] = str(Path(args.config).resolve())
    for name, value in flags.items():
        if value is not None:
            os.environ[ENV_PREFIX + name.upper()] = str(value)
    uvicorn.run("mqgate.api.asgi:create_app", factory=True, workers=settings.workers, **options)
    return 0


def _admin_token(args: argparse.Namespace) -> str:
    if args.admin_token:
        return str(args.admin_token)
    env = os.environ.get("MQGATE_ADMIN_TOKEN")
    if env:
        return env
    path = Path(os.environ.get("MQGATE_DATA_DIR", "data")) / "admin.token"
    if path.exists():
        return path.read_text().strip()
    raise SystemExit("no admin token: pass --admin-token or set MQGATE_ADMIN_TOKEN")


def _request(
    args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None
) -> tuple[int, Any]:
    """Call the admin API; return (exit code, result), printing the error on failure."""
    url = args.url.rstrip("/") + path
    data = None if body is None else json.dumps({k: v for k, v in body.items() if v is not None}).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Authorization", f"Bearer {_admin_token(args)}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return 0, json.loads(resp.read())["result"]
    except urllib.error.HTTPError as exc:
        payload = json.loads(exc.read() or b"{}")
        print(f"error {exc.code}: {payload.get('message', exc.reason)}", file=sys.stderr)
        return 1, None
    except urllib.error.URLError as exc:
        print(f"cannot reach {url}: {exc.reason}", file=sys.stderr)
        return 2, None


def _call(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None) -> int:
    code, result = _request(args, method, path, body)
    if code == 0:
        print(json.dumps(result, indent=2))
    return code


def _progress_table(args: argparse.Namespace) -> int:
    if args.json:
        return _call(args, "GET", f"/admin/consumers/{args.name}/progress")
    code, p = _request(args, "GET", f"/admin/consumers/{args.name}/progress")
    if code:
        return code
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mqgate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run a gateway")
    serve.add_argument("--config", help="TOML settings file")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--data-dir")
    serve.add_argument("--fsync", help="always (default) or interval:<ms>")
    serve.add_argument("--store", help="embedded (default) or a Redis URL, e.g. redis://127.0.0.1:6379/0")
    serve.add_argument("--registry", help="SQLAlchemy URL, e.g. postgresql+psycopg://user@host/db")
    serve.add_argument("--workers", type=int, help="gateway processes on this port (needs --store redis://)")
    serve.set_defaults(func=_serve)

    def admin(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--url", default=os.environ.get("MQGATE_URL", "http://127.0.0.1:8080"))
        p.add_argument("--admin-token")
        return p

    topic = sub.add_parser("topic", help="topics").add_subparsers(dest="action", required=True)
    t = admin(topic.add_parser("create"))
    t.add_argument("name")
    t.add_argument("--queues", type=int)
    t.add_argument("--retention-ms", type=int)
    t.add_argument("--retention-bytes", type=int)
    t.set_defaults(
        func=lambda a: _call(
            a,
            "POST",
            "/admin/topics",
            {
                "name": a.name,
                "queues": a.queues,
                "retentionMs": a.retention_ms,
                "retentionBytes": a.retention_bytes,
            },
        )
    )
    admin(topic.add_parser("list")).set_defaults(func=lambda a: _call(a, "GET", "/admin/topics"))

    producer = sub.add_parser("producer", help="producers").add_subparsers(dest="action", required=True)
    p = admin(producer.add_parser("register"))
    p.add_argument("name")
    p.add_argument("--topic", required=True)
    p.set_defaults(func=lambda a: _call(a, "POST", "/admin/producers", {"name": a.name, "topic": a.topic}))

    consumer = sub.add_parser("consumer", help="consumers").add_subparsers(dest="action", required=True)
    c = admin(consumer.add_parser("register"))
    c.add_argument("name")
    c.add_argument("--topic", required=True)
    c.add_argument("--mode", choices=["cluster", "broadcast"])
    c.add_argument("--start", help="earliest, latest or epoch ms")
    c.add_argument("--lock-timeout-s", type=float)
    c.add_argument("--max-attempts", type=int)
    c.set_defaults(
        func=lambda a: _call(
            a,
            "POST",
            "/admin/consumers",
            {
                "name": a.name,
                "topic": a.topic,
                "mode": a.mode,
                "start": a.start,
                "lockTimeoutS": a.lock_timeout_s,
                "maxAttempts": a.max_attempts,
            },
        )
    )
    c = admin(consumer.add_parser("progress"))
    c.add_argument("name")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_progress_table)
    c = admin(consumer.add_parser("reset"))
    c.add_argument("name")
    c.add_argument("--to", required=True, choices=["earliest", "latest", "offset", "timestamp"])
    c.add_argument("--offset", type=int)
    c.add_argument("--timestamp", type=int)
    c.add_argument("--queue", type=int)
    c.add_argument("--client-id")
    c.set_defaults(
        func=lambda a: _call(
            a,
            "POST",
            f"/admin/consumers/{a.name}/reset",
            {
                "to": a.to,
                "offset": a.offset,
                "timestamp": a.timestamp,
                "queue": a.queue,
                "clientId": a.client_id,
            },
        )
    )
    for action in ("pause", "resume"):
        c = admin(consumer.add_parser(action))
        c.add_argument("name")
        c.set_defaults(func=lambda a, act=action: _call(a, "POST", f"/admin/consumers/{a.name}/{act}", {}))
    c = admin(consumer.add_parser("rate-limit"))
    c.add_argument("name")
    c.add_argument("messages_per_second", type=float)
    c.set_defaults(
        func=lambda a: _call(
            a,
            "POST",
            f"/admin/consumers/{a.name}/rate-limit",
            {"messagesPerSecond": a.messages_per_second},
        )
    )
    c = admin(consumer.add_parser("alert"))
    c.add_argument("name")
    c.add_argument("backlog", type=int)
    c.set_defaults(
        func=lambda a: _call(a, "POST", f"/admin/consumers/{a.name}/alert", {"backlog": a.backlog})
    )
    admin(sub.add_parser("alerts", help="active backlog alerts")).set_defaults(
        func=lambda a: _call(a, "GET", "/admin/alerts")
    )
    add_pipeline_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except MqgateError as exc:
        print(f"mqgate: {exc.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
