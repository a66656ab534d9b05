"""The gateway's CPU per produce with tracing off vs every message traced (issue 11), measured in
one process: the ASGI app driven directly by concurrent callers, no HTTP and no load generator
sharing the CPU, so the figure (process CPU time per request, user and system) moves far less
with the machine's other load than wrk's throughput does.

    PYTHONPATH=src .venv/bin/python benchmarks/trace_cpu_bench.py --batch 1 --conns 64
    PYTHONPATH=src .venv/bin/python benchmarks/trace_cpu_bench.py --batch 100 --conns 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from typing import Any

from mqgate.api.app import build_app
from mqgate.settings import load_settings

ADMIN = "admintoken-0123456789abcdef"


async def call(app: Any, path: str, body: bytes, token: str) -> tuple[int, bytes]:
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"authorization", f"Bearer {token}".encode()), (b"content-type", b"application/json")],
        "http_version": "1.1",
        "scheme": "http",
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    given = False
    answer: dict[str, Any] = {"body": b""}

    async def receive() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the request is whole: nothing more comes
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
        elif message["type"] == "http.response.body":
            answer["body"] += message.get("body", b"")

    await app(scope, receive, send)
    return int(answer["status"]), bytes(answer["body"])


async def measure(trace: bool, batch: int, conns: int, seconds: float) -> str:
    os.environ["MQGATE_DATA_DIR"] = tempfile.mkdtemp(prefix="mqgate-trace-cpu-")
    os.environ["MQGATE_ADMIN_TOKEN"] = ADMIN
    app = build_app(load_settings())
    lifespan: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    started = asyncio.Event()

    async def lifespan_send(message: dict[str, Any]) -> None:
        started.set()

    running = asyncio.create_task(app({"type": "lifespan"}, lifespan.get, lifespan_send))
    await lifespan.put({"type": "lifespan.startup"})
    await asyncio.wait_for(started.wait(), 30)

    async def admin(path: str, **fields: Any) -> dict[str, Any]:
        status, body = await call(app, path, json.dumps(fields).encode(), ADMIN)
        assert status == 200, body
        return dict(json.loads(body)["result"])

    await admin("/admin/topics", name="bench", queues=4)
    token = (await admin("/admin/producers", name="bp", topic="bench"))["token"]
    if trace:
        await admin("/admin/trace-policies", mode="project", project="default", level="info")
    message = {"message": "x" * 100}
    if batch == 1:
        path, body = "/mq/produce", json.dumps({"producer": "bp", **message}).encode()
    else:
        many = {"producer": "bp", "messages": [message] * batch}
        path, body = "/mq/produce/batch", json.dumps(many).encode()
    count = 0

    async def caller(until: float) -> None:
        nonlocal count
        while time.monotonic() < until:
            status, answer = await call(app, path, body, token)
            assert status == 200, answer
            count += 1

    await asyncio.gather(*(caller(time.monotonic() + 1) for _ in range(conns)))  # warm up
    count = 0
    before, t0 = os.times(), time.monotonic()
    await asyncio.gather(*(caller(t0 + seconds) for _ in range(conns)))
    after, t1 = os.times(), time.monotonic()
    await lifespan.put({"type": "lifespan.shutdown"})
    await running
    user = (after.user - before.user) / count * 1e6
    system = (after.system - before.system) / count * 1e6
    return (
        f"trace={'on' if trace else 'off'} batch={batch}: {count * batch / (t1 - t0):,.0f} msgs/s, "
        f"CPU {user + system:.0f} µs/request (user {user:.0f}, system {system:.0f}), "
        f"{(user + system) / batch:.1f} µs/message"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1, help="messages per request (1: /mq/produce)")
    parser.add_argument("--conns", type=int, default=64, help="concurrent callers")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run")
    parser.add_argument("--rounds", type=int, default=2, help="off/on pairs")
    args = parser.parse_args()
    for _ in range(args.rounds):
        for trace in (False, True):
            print(asyncio.run(measure(trace, args.batch, args.conns, args.seconds)), flush=True)


if __name__ == "__main__":
    main()
