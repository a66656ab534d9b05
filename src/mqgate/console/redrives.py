"""Paced dead-letter redrives in the background (as SQS's redrive task): the operator starts one
and the page answers at once; the gateway process that took the request runs it slice after
slice (each a `DeadLetters.redrive` of at most PACED_MAX_S, holding the redrive lock while it
copies), keeping the pace across slices, until nothing the selection chose is left. One at a
time per consumer on this process; cancellable (the slice in progress stops at its next step,
and what it copied is recorded); its progress is on the dead-letter page; started, cancelled
and finished are audited under the user who started it.

The tasks live in this gateway process: another gateway of the same deployment does not list
them (its moves still wait for the same redrive lock), and a gateway that stops ends them (what
a cancelled slice copied without recording may be copied again, at least once, as any redrive)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec

from mqgate.errors import Conflict, MqgateError
from mqgate.services.deadletters import DeadLetters, RedriveControl, Selection

log = logging.getLogger(__name__)

FINISHED_KEPT_S: Final = 3600.0  # a finished task is shown this long on its page
COPIES_AUDITED: Final = 200  # copies an audit entry lists (their count is always there)

# (actor, action, target, project, after): an audit entry.
Audit = Callable[[str, str, str, str, Any], Awaitable[None]]


def now_ms() -> int:
    return int(time.time() * 1000)


class RedriveTask(msgspec.Struct):
    consumer: str
    project: str
    actor: str
    selection: Selection
    scope: str
    filters: dict[str, str]
    started_ms: int = msgspec.field(default_factory=now_ms)
    left: int | None = None  # chosen and not copied yet, after the last slice (None: none ran)
    slices: int = 0
    state: str = "running"  # running, done, cancelled, failed
    error: str = ""
    finished_ms: int | None = None
    copies: list[dict[str, Any]] = msgspec.field(default_factory=list)  # the first COPIES_AUDITED
    control: RedriveControl = msgspec.field(default_factory=RedriveControl)  # its stop, its copies so far
    task: asyncio.Task[None] | None = None

    @property
    def copied(self) -> int:
        return self.control.copied

    @property
    def stop(self) -> asyncio.Event:
        return self.control.stop

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def mode(self) -> str:
        return "copy" if self.selection.copy else "move"

    def entry(self) -> dict[str, Any]:
        """What the audit keeps of it."""
        return {
            "mode": self.mode,
            "scope": self.scope,
            "rate": self.selection.rate_per_s,
            "filter": self.filters,
            "state": self.state,
            "copied": self.copied,
            "left": self.left,
            "slices": self.slices,
            "error": self.error or None,
            "redriven": self.copies,
        }


class RedriveTasks:
    """This process's background redrives, one per consumer at a time."""

    def __init__(self, dead_letters: DeadLetters, audit: Audit) -> None:
        self.dead_letters = dead_letters
        self.audit = audit
        self.tasks: dict[str, RedriveTask] = {}

    def of(self, consumer: str) -> RedriveTask | None:
        """The consumer's task: running, or finished within FINISHED_KEPT_S."""
        found = self.tasks.get(consumer)
        if found is not None and found.finished_ms and now_ms() - found.finished_ms > FINISHED_KEPT_S * 1000:
            del self.tasks[consumer]
            return None
        return found

    async def start(
        self, consumer: str, project: str, actor: str, sel: Selection, scope: str, filters: dict[str, str]
    ) -> RedriveTask:
        sel.check()
        running = self.of(consumer)
        if running is not None and running.running:
            raise Conflict(
                f"a redrive of {consumer}'s dead letters is running already (started by {running.actor}): "
                "wait for it or cancel it",
                code="redrive_busy",
            )
        job = RedriveTask(consumer, project, actor, sel, scope, filters)
        self.tasks[consumer] = job
        await self.audit(actor, "deadletter.redrive.start", consumer, project, job.entry())
        job.task = asyncio.get_running_loop().create_task(self._run(job), name=f"redrive {consumer}")
        return job

    async def cancel(self, consumer: str, actor: str) -> RedriveTask:
        job = self.of(consumer)
        if job is None or not job.running:
            raise Conflict(f"no redrive of {consumer}'s dead letters is running", code="no_redrive")
        job.stop.set()
        await self.audit(
            actor, "deadletter.redrive.cancel", consumer, job.project, {"by": actor, "copied": job.copied}
        )
        return job

    async def wait(self, consumer: str) -> None:
        """Until the consumer's task (if any) has finished (for a gateway that stops)."""
        job = self.tasks.get(consumer)
        if job is not None and job.task is not None:
            await asyncio.gather(job.task, return_exceptions=True)

    async def _run(self, job: RedriveTask) -> None:
        sel = job.selection
        rate = sel.rate_per_s
        try:
            while not job.stop.is_set():
                started = time.monotonic()
                result = await self.dead_letters.redrive(job.consumer, sel, job.control)
                made = len(result.redriven)
                job.left = result.left
                job.slices += 1
                room = COPIES_AUDITED - len(job.copies)
                job.copies += [msgspec.structs.asdict(c) for c in result.redriven[: max(room, 0)]]
                more = result.left > 0 or (sel.offset is None and result.scanned >= sel.scan)
                if not more:
                    break
                # The next slice goes on where this one ended, at the same pace.
                sel = msgspec.structs.replace(sel, start=result.next)
                if rate is not None:
                    with contextlib.suppress(TimeoutError):
                        wait_s = started + made / rate - time.monotonic()
                        await asyncio.wait_for(job.stop.wait(), max(0.0, wait_s))
            job.state = "cancelled" if job.stop.is_set() else "done"
        except MqgateError as exc:
            job.state, job.error = "failed", str(exc)
        except Exception as exc:  # a task's failure is shown and audited, not lost in a log alone
            log.exception("background redrive of %s failed", job.consumer)
            job.state, job.error = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            job.finished_ms = now_ms()
            if job.state == "running":  # cancelled by the gateway stopping
                job.state = "cancelled"
        try:
            await self.audit(job.actor, "deadletter.redrive", job.consumer, job.project, job.entry())
        except Exception:
            log.exception("the audit entry of %s's background redrive was not written", job.consumer)
