"""Baseline D: the durable HTTP ceiling.

Baseline A's raw ASGI app (`baseline_asgi.py`), which also makes each request's body durable
before it answers: the body is appended to one log file (length-prefixed, `os.write` inline) and
the answer waits for a group commit (one flusher task, one `os.fsync` in a worker thread a
round, for every request written before it began). No framework, no auth, no validation, no
ids, no index, no metrics: the least a durable single produce can cost on this server, with
`fsync=always` and the round journal's one fsync a round. `MQB_DURABLE_DIR` is the directory of
its log file (default: a new temporary directory).

    MQB_DURABLE_DIR=/tmp/d uvicorn benchmarks.bench.baseline_durable:app --http httptools --loop uvloop
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from typing import Any

from benchmarks.bench.baseline_asgi import BODY, HEADERS


class Log:
    def __init__(self, directory: str) -> None:
        self.fd = os.open(os.path.join(directory, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.waiters: list[asyncio.Future[None]] = []
        self.wake = asyncio.Event()

    def append(self, body: bytes) -> asyncio.Future[None]:
        os.write(self.fd, len(body).to_bytes(4, "little") + body)
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        self.wake.set()
        return fut

    async def flusher(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.wake.wait()
            self.wake.clear()
            waiters, self.waiters = self.waiters, []
            await loop.run_in_executor(None, os.fsync, self.fd)
            for fut in waiters:
                fut.set_result(None)


log: Log | None = None


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    global log
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                log = Log(os.environ.get("MQB_DURABLE_DIR") or tempfile.mkdtemp(prefix="mqb-durable-"))
                asyncio.get_running_loop().create_task(log.flusher())
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        msg = await receive()
        body += msg.get("body", b"")
        more = msg.get("more_body", False)
    assert log is not None
    if scope["path"] != "/healthz":
        await log.append(body)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})
