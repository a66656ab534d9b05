#!/usr/bin/env python3
"""Python calls per request of the data path: the budget `make test` holds (issue 28 item 3).

For each path, untraced and traced (a project policy at info), the interpreter's count of
function calls (`sys.setprofile` 'call' and 'c_call' events) made while the gateway serves ONE
request: a produce of one message, a batch produce of 100, a pull of 100 (`max=100`), the ack
of that pull, and a pull of 100 that carries the previous pull's requestId (its ack: the
benchmarks' pull + ack, one request a batch). The ASGI app is called directly (no server, no
socket) in an event loop of this process, on the embedded store in a temporary directory, with
fsync=always.

What is counted, so that the count is the same run after run, whatever else the machine does:

- Only this thread (the profile hook is per thread: the fsync thread pool is not counted), and
  in it only two tasks: the request's own, and the group commit's (its round that makes the
  request's writes durable: the answer waits for it). Not the event loop between tasks, not
  any background task (timers, samplers, the trace recorder's flush, the trace indexer).
- Not the inside of the event loop's and the thread pool's own code (asyncio, concurrent,
  threading): a call into it from the gateway counts once, what it calls within itself does
  not. Its work depends on what else is scheduled (how many timers a new one passes in the
  loop's heap, whether a task waits on the Event being set, whether the pool has an idle thread).
- Each path is warmed up first (imports, caches, the trace index writer started), the garbage
  collector runs before and not during the counted request, and the background work whose
  period the settings give (registry refresh, checkpoints, samplers, alert checks, failover
  checks) is set an hour apart. The free-space check is off: it looks at the file system once
  per 0.25 s, so which request pays for the look depends on the clock.
- Before each counted request, what the previous one left behind runs first: a few turns of
  the loop (its round's wakes) and, traced, the trace recorder's flush of the events it
  buffers (a pull's hops: they are written within 50 ms, by the recorder's own task), awaited
  until durable, so that no one else's round is in flight when the request starts. And each
  path is counted until two requests in a row give the same count (at most TRIES).

    .venv/bin/python benchmarks/call_budget.py            # the counts against the budget
    .venv/bin/python benchmarks/call_budget.py --record   # rewrite benchmarks/call_budget.json
    .venv/bin/python benchmarks/call_budget.py --detail calls.json   # every count by function

tests/perf/test_call_budget.py fails when a count is more than 5 % over its budget, or more
than 20 % under it (the file is then out of date): re-record after an intended change. Wall
clock figures stay in the benchmarks (run.py), never in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import datetime
import gc
import json
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
BUDGET_FILE = ROOT / "benchmarks" / "call_budget.json"
RECORD_COMMAND = ".venv/bin/python benchmarks/call_budget.py --record"
OVER = 0.05  # a count more than 5 % over its budget fails
UNDER = 0.20  # ... and one more than 20 % under it: the budget is out of date
# pull_acking: a pull of 100 carrying the previous pull's requestId, its ack (the benchmarks' pull
# + ack: one request acks one batch and leases the next).
PATHS = ("produce", "produce_batch", "pull", "ack", "pull_acking")
MODES = ("untraced", "traced")
KEYS = tuple(f"{path}/{mode}" for path in PATHS for mode in MODES)
BATCH = 100  # messages of a batch produce, of a pull and so of its ack
BODY = "x" * 100  # the benchmarks' 100-byte message
WARMUPS = 2  # requests of each path before the counted ones
TRIES = 6  # counted requests of a path at most, until two in a row agree
ADMIN = "mqa_call_budget_0123456789abcdef"
# The background work the settings time, an hour apart: it is not counted, but a registry
# refresh could change what a request finds.
QUIET: dict[str, Any] = {
    "registry_refresh_s": 3600.0,
    "retention_check_s": 3600.0,
    "checkpoint_interval_s": 3600.0,
    "journal_settle_interval_s": 3600.0,  # a settle's round (once a second) is background work
    "queue_state_sample_s": 3600.0,
    "queue_state_interval_s": 3600.0,
    "alert_check_interval_s": 3600.0,
    "failover_check_s": 3600.0,
    "failover_probe_interval_s": 3600.0,
    "disk_free_floor_bytes": 0,
}
# The event loop's and the thread pool's own code (see the module's doc).
MACHINERY = (
    str(Path(asyncio.__file__).parent) + "/",
    str(Path(concurrent.futures.__file__).parent.parent) + "/",
    str(threading.__file__),
)
REQUEST, COMMIT = "request", "commit"


class CallCounter:
    """A `sys.setprofile` hook: the calls made by the tasks in `tasks`, each under its bucket,
    the insides of MACHINERY left out."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tasks: dict[Any, str], detail: bool = False) -> None:
        self.loop = loop
        self.tasks = tasks
        self.python: Counter[str] = Counter()  # 'call': a Python function starts, a coroutine resumes
        self.c: Counter[str] = Counter()  # 'c_call': a builtin or C function called from Python
        self.by_function: Counter[str] | None = Counter() if detail else None

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            bucket = self.tasks.get(asyncio.current_task(self.loop))
            if bucket is None:
                return
            code = frame.f_code
            if code.co_filename.startswith(MACHINERY):
                caller = frame.f_back
                if caller is None or caller.f_code.co_filename.startswith(MACHINERY):
                    return
            self.python[bucket] += 1
            if self.by_function is not None:
                self.by_function[f"{bucket} {code.co_filename}:{code.co_firstlineno} {code.co_qualname}"] += 1
        elif event == "c_call":
            bucket = self.tasks.get(asyncio.current_task(self.loop))
            if bucket is None or frame.f_code.co_filename.startswith(MACHINERY):
                return
            self.c[bucket] += 1
            if self.by_function is not None:
                self.by_function[f"{bucket} C {getattr(arg, '__qualname__', repr(arg))}"] += 1

    def count(self) -> Count:
        python, c = self.python, self.c
        return Count(
            python[REQUEST] + c[REQUEST], python[COMMIT] + c[COMMIT], python[REQUEST] + python[COMMIT]
        )


@dataclass(slots=True, frozen=True)
class Count:
    """One request's calls: its task's and the group commit's, and how many were Python calls."""

    request: int
    commit: int
    python: int
    tries: int = 0

    @property
    def calls(self) -> int:
        return self.request + self.commit


@dataclass
class Measured:
    counts: dict[str, Count] = field(default_factory=dict)  # by KEYS
    by_function: dict[str, Counter[str]] = field(default_factory=dict)  # with detail

    def calls(self) -> dict[str, int]:
        return {key: count.calls for key, count in self.counts.items()}


# --- one request through the ASGI app ----------------------------------------------------------


@dataclass(slots=True)
class Answer:
    status: int = 0
    body: bytes = b""

    def result(self) -> dict[str, Any]:
        assert self.status == 200, self.body
        return dict(json.loads(self.body)["result"])


async def serve_one(
    app: Any, method: str, path: str, token: str, body: bytes = b"", query: str = ""
) -> Answer:
    """One request through the ASGI app, as a server would hand it over."""
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "headers": [
            (b"authorization", b"Bearer " + token.encode()),
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
        ],
        "http_version": "1.1",
        "scheme": "http",
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
    }
    answer = Answer()
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop() if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer.status = message["status"]
        else:
            answer.body += message.get("body", b"")

    await app(scope, receive, send)
    return answer


Request = Callable[[], Coroutine[Any, Any, Answer]]


@dataclass
class Harness:
    """A gateway app running in this event loop: topic `budget` (8 queues) with producer
    `budget-p` for the produces; topic `pulled` (8 queues) with producer `pulled-p` and consumer
    `pulled-c` for pulls and acks."""

    app: Any
    recorder: Any  # the trace recorder (tracing/recorder.py)
    lifespan: asyncio.Queue[dict[str, str]]
    running: asyncio.Task[None]
    tokens: dict[str, str] = field(default_factory=dict)
    traced: bool = False

    async def settle(self) -> None:
        """Let the work the last request left behind run: the wakes of its round (a few turns
        of the loop) and, traced, the trace recorder's buffered events (a pull's hops, flushed
        within 50 ms; now, and their round awaited)."""
        for _ in range(3):
            await asyncio.sleep(0)
        if self.traced:
            await self.recorder.flush()
            for _ in range(3):
                await asyncio.sleep(0)

    def prepared(
        self, method: str, path: str, token: str, fields: Any = None, query: str = ""
    ) -> Callable[[], Coroutine[Any, Any, Answer]]:
        """The request, its body encoded now (a counted request counts the app's calls, not these)."""
        body = json.dumps(fields).encode() if fields is not None else b""
        token = self.tokens.get(token, token)
        return lambda: serve_one(self.app, method, path, token, body, query)

    async def call(self, method: str, path: str, token: str, fields: Any = None, query: str = "") -> Answer:
        return await self.prepared(method, path, token, fields, query)()

    async def admin(self, path: str, **fields: Any) -> dict[str, Any]:
        return (await self.call("POST", path, ADMIN, fields)).result()

    async def stop(self) -> None:
        await self.lifespan.put({"type": "lifespan.shutdown"})
        await self.running

    # What each path's counted request is, after what it needs was done (not counted).

    async def produce(self) -> Request:
        fields = {"producer": "budget-p", "message": BODY}
        return self.prepared("POST", "/mq/produce", "budget-p", fields)

    async def produce_batch(self) -> Request:
        fields = {"producer": "budget-p", "messages": [{"message": BODY}] * BATCH}
        return self.prepared("POST", "/mq/produce/batch", "budget-p", fields)

    async def _fill(self) -> None:
        """BATCH messages for the next pull, all in one queue (one order key): the pull's
        choice, the queue with the most backlog."""
        messages = [{"message": BODY, "orderKey": "k"}] * BATCH
        await self.call(
            "POST", "/mq/produce/batch", "pulled-p", {"producer": "pulled-p", "messages": messages}
        )

    def _pull(self, acking: str = "") -> Request:
        fields: dict[str, Any] = {"topic": "pulled", "consumer": "pulled-c", "max": BATCH}
        if acking:
            fields["requestId"] = acking
        return self.prepared("GET", "/mq/message", "pulled-c", query=urlencode(fields))

    async def pull(self) -> Request:
        await self._fill()
        return self._pull()

    async def ack(self) -> Request:
        await self._fill()
        found = (await self._pull()()).result()
        assert len(found["msgList"]) == BATCH, found
        fields = {"requestId": found["requestId"], "consumer": "pulled-c"}
        return self.prepared("POST", "/mq/ack", "pulled-c", fields)

    async def pull_acking(self) -> Request:
        await self._fill()
        found = (await self._pull()()).result()
        assert len(found["msgList"]) == BATCH, found
        await self._fill()
        return self._pull(acking=found["requestId"])

    async def after(self, path: str, answer: Answer) -> None:
        """Check the answer; ack a pull (the next pull finds the next BATCH)."""
        result = answer.result()
        if path == "produce_batch":
            assert len(result["receipts"]) == BATCH, result
        elif path in ("pull", "pull_acking"):
            assert len(result["msgList"]) == BATCH, result
            (await self.call("POST", "/mq/ack", "pulled-c", {"requestId": result["requestId"]})).result()


async def start(data_dir: Path) -> Harness:
    from mqgate.app import build_site
    from mqgate.settings import load_settings

    # env={}: no MQGATE_* variable of the caller's changes what is measured.
    settings = load_settings(env={}, data_dir=data_dir, admin_token=ADMIN, fsync="always", **QUIET)
    built = build_site(settings)
    app = built.site
    lifespan: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    started: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

    async def lifespan_send(message: dict[str, Any]) -> None:
        if not started.done():
            started.set_result(message)

    running = asyncio.create_task(app({"type": "lifespan"}, lifespan.get, lifespan_send))
    await lifespan.put({"type": "lifespan.startup"})
    message = await asyncio.wait_for(started, 120)
    assert message["type"] == "lifespan.startup.complete", message
    h = Harness(app, built.platform.tracing.recorder, lifespan, running)
    for topic in ("budget", "pulled"):
        await h.admin("/admin/topics", name=topic, queues=8)
        h.tokens[f"{topic}-p"] = (await h.admin("/admin/producers", name=f"{topic}-p", topic=topic))["token"]
    h.tokens["pulled-c"] = (await h.admin("/admin/consumers", name="pulled-c", topic="pulled"))["token"]
    return h


# --- counting ---------------------------------------------------------------------------------------


async def counted(h: Harness, request: Request, detail: bool) -> tuple[CallCounter, Answer]:
    """Serve one request, counting its calls (module doc)."""
    loop = asyncio.get_running_loop()
    await h.settle()
    task = loop.create_task(request())
    tasks: dict[Any, str] = {task: REQUEST}
    tasks.update({t: COMMIT for t in asyncio.all_tasks(loop) if t.get_name() == "group-commit"})
    assert COMMIT in tasks.values(), "no group commit task: is the store embedded with fsync=always?"
    counter = CallCounter(loop, tasks, detail)
    collecting, profiler = gc.isenabled(), sys.getprofile()
    gc.collect()
    gc.disable()
    sys.setprofile(counter)
    try:
        answer = await task
    finally:
        sys.setprofile(profiler)
        if collecting:
            gc.enable()
    return counter, answer


async def count_path(h: Harness, path: str, detail: bool) -> tuple[Count, Counter[str] | None]:
    """WARMUPS requests of `path`, then counted ones until two in a row agree."""
    for _ in range(WARMUPS):
        request = await getattr(h, path)()
        await h.after(path, await request())
    seen: list[Count] = []
    for tries in range(1, TRIES + 1):
        request = await getattr(h, path)()
        counter, answer = await counted(h, request, detail)
        await h.after(path, answer)
        count = counter.count()
        if seen and seen[-1] == count:
            return Count(count.request, count.commit, count.python, tries), counter.by_function
        seen.append(count)
    raise AssertionError(f"{path}: no two counts in a row agree in {TRIES} requests: {seen}")


async def measure_async(data_dir: Path, detail: bool) -> Measured:
    measured = Measured()
    h = await start(data_dir)
    try:
        for mode in MODES:
            if mode == "traced":
                await h.admin("/admin/trace-policies", mode="project", project="default", level="info")
                h.traced = True
            for path in PATHS:
                key = f"{path}/{mode}"
                measured.counts[key], by_function = await count_path(h, path, detail)
                if by_function is not None:
                    measured.by_function[key] = by_function
    finally:
        await h.stop()
    return measured


def measure(detail: bool = False) -> Measured:
    """Every path's calls per request, by "<path>/<mode>" (with `detail`, by function too)."""
    with tempfile.TemporaryDirectory(prefix="mqgate-call-budget-") as tmp:
        return asyncio.run(measure_async(Path(tmp) / "data", detail))


# --- the recorded budget ------------------------------------------------------------------------------


def load_budget(path: Path = BUDGET_FILE) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def verdicts(calls: dict[str, int], budget: dict[str, int]) -> list[str]:
    """What is wrong, one line each: a count over its budget by more than OVER, under it by
    more than UNDER, or without a budget."""
    wrong = []
    for key in KEYS:
        count, allowed = calls[key], budget.get(key)
        if allowed is None:
            wrong.append(f"{key}: {count:,} calls per request and no budget recorded: run {RECORD_COMMAND}")
        elif count > allowed * (1 + OVER):
            wrong.append(
                f"{key}: {count:,} calls per request, {count / allowed - 1:.1%} over its budget of "
                f"{allowed:,} (at most {OVER:.0%} over). If the change is intended, re-record the "
                f"budget ({RECORD_COMMAND}) and commit benchmarks/call_budget.json with it; "
                "`--detail FILE` shows the calls by function"
            )
        elif count < allowed * (1 - UNDER):
            wrong.append(
                f"{key}: {count:,} calls per request, {1 - count / allowed:.1%} under its budget of "
                f"{allowed:,} (more than {UNDER:.0%} under): the budget is out of date; re-record it "
                f"({RECORD_COMMAND}) and commit benchmarks/call_budget.json with the change"
            )
    return wrong


def git_commit() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return "unknown"
    return head + (" (with uncommitted changes)" if git("status", "--porcelain", "--", "src") else "")


def record(measured: Measured, path: Path = BUDGET_FILE) -> None:
    document = {
        "about": (
            "The budget of Python calls per request of each data path, untraced and traced at info: "
            "sys.setprofile 'call' + 'c_call' events of the request's task and of the group commit "
            "round it waits for (benchmarks/call_budget.py says exactly what is counted). "
            f"tests/perf/test_call_budget.py fails when a count is more than {OVER:.0%} over its "
            f"budget or more than {UNDER:.0%} under it. Re-record after an intended change: "
            f"{RECORD_COMMAND}"
        ),
        "commit": git_commit(),
        "date": datetime.date.today().isoformat(),
        "python": ".".join(map(str, sys.version_info[:3])),
        "calls": measured.calls(),
        "parts": {
            key: {"request": c.request, "commit": c.commit, "python": c.python}
            for key, c in measured.counts.items()
        },
    }
    path.write_text(json.dumps(document, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--record", action="store_true", help=f"rewrite {BUDGET_FILE.relative_to(ROOT)}")
    ap.add_argument("--json", action="store_true", help="print only the calls per path, as JSON")
    ap.add_argument("--detail", metavar="FILE", help="write each path's calls by function to FILE (JSON)")
    args = ap.parse_args(argv)
    measured = measure(detail=bool(args.detail))
    if args.detail:
        Path(args.detail).write_text(json.dumps(measured.by_function, indent=1, sort_keys=True) + "\n")
    if args.json:
        print(json.dumps(measured.calls()))
        return 0
    budget: dict[str, int] = load_budget()["calls"] if BUDGET_FILE.exists() else {}
    header = ("path/mode", "calls", "request", "commit", "python", "tries", "budget")
    print("{:<24}{:>8}{:>9}{:>8}{:>8}{:>6}{:>8}  change".format(*header))
    for key, c in measured.counts.items():
        allowed = budget.get(key)
        change = f"{c.calls / allowed - 1:+.1%}" if allowed else "-"
        print(
            f"{key:<24}{c.calls:>8,}{c.request:>9,}{c.commit:>8,}{c.python:>8,}{c.tries:>6}"
            f"{allowed or 0:>8,}  {change}"
        )
    if args.record:
        record(measured)
        print(f"recorded in {BUDGET_FILE.relative_to(ROOT)}")
        return 0
    wrong = verdicts(measured.calls(), budget)
    print("\n".join(wrong) if wrong else "every path within its budget")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
