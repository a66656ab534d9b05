"""Dead-letter queues between SQS queues (issue 30): RedrivePolicy and RedriveAllowPolicy read as
AWS reads them, and the message move tasks that send dead letters back.

A queue's RedrivePolicy names a dead-letter queue of the same account and a `maxReceiveCount`:
the queue's consumer takes that count as its max attempts, and the message-level mode moves a
message received once more than that to the dead-letter queue's topic instead of the consumer's
own dead-letter topic (`MessageConsuming.dead_letter_route`), keeping its id, body and attributes.

A move task (StartMessageMoveTask) receives from the dead-letter queue through its own
message-level consumer, sends each message to the queue it came from (or to the destination
named) and only then deletes it there: a gateway that dies mid-task loses nothing, and what it
had received comes back to the dead-letter queue after the visibility timeout (at least once,
as AWS's own move tasks are). Tasks are kept by the gateway that runs them: ListMessageMoveTasks
on another gateway does not show them, and a restart ends them (start another).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from mqgate.sqs import errors as e
from mqgate.sqs.errors import SqsError

log = logging.getLogger(__name__)

MAX_RECEIVE_COUNT: Final = 1000
MAX_ALLOWED_SOURCES: Final = 10
MOVE_STEP: Final = 10  # messages a move step receives at once
KEEP_FINISHED_TASKS: Final = 10  # ended tasks listed per source, newest first, as AWS lists them
ALLOW_ALL: Final = "allowAll"
DENY_ALL: Final = "denyAll"
BY_QUEUE: Final = "byQueue"
_ARN: Final = re.compile(r"arn:aws[a-z-]*:sqs:([a-z0-9-]*):(\d{12}):([A-Za-z0-9_-]{1,80}(?:\.fifo)?)")


def queue_of_arn(arn: str, account: str) -> str | None:
    """The queue an SQS ARN names, if it is one of `account`'s (else None: no other account's
    queue is ever found)."""
    m = _ARN.fullmatch(arn.strip())
    if m is None or m.group(2) != account:
        return None
    return m.group(3)


class RedrivePolicy(msgspec.Struct, frozen=True):
    target_arn: str
    target: str  # the dead-letter queue's name, in the same account
    max_receive_count: int

    def text(self) -> str:
        """As GetQueueAttributes answers it."""
        return msgspec.json.encode(
            {"deadLetterTargetArn": self.target_arn, "maxReceiveCount": self.max_receive_count}
        ).decode()


class AllowPolicy(msgspec.Struct, frozen=True):
    permission: str
    sources: frozenset[str]  # queue names (byQueue)
    source_arns: tuple[str, ...]

    def allows(self, source: str) -> bool:
        if self.permission == ALLOW_ALL:
            return True
        return self.permission == BY_QUEUE and source in self.sources

    def text(self) -> str:
        out: dict[str, Any] = {"redrivePermission": self.permission}
        if self.source_arns:
            out["sourceQueueArns"] = list(self.source_arns)
        return msgspec.json.encode(out).decode()


def _json_map(name: str, text: str) -> dict[str, Any]:
    try:
        data = msgspec.json.decode(text)
    except msgspec.DecodeError:
        data = None
    if not isinstance(data, dict):
        raise e.invalid_value_for(name, text, f"{name} is not a valid JSON map.")
    return data


def parse_redrive_policy(text: str, account: str) -> RedrivePolicy | None:
    """A RedrivePolicy as set (an empty value removes it: None)."""
    if not text.strip():
        return None
    data = _json_map("RedrivePolicy", text)
    unknown = sorted(set(data) - {"deadLetterTargetArn", "maxReceiveCount"})
    if unknown:
        raise e.invalid_value_for("RedrivePolicy", text, f"Redrive policy has an unknown key: {unknown[0]}.")
    arn, count = data.get("deadLetterTargetArn"), data.get("maxReceiveCount")
    for key, value in (("deadLetterTargetArn", arn), ("maxReceiveCount", count)):
        if value is None:
            raise e.invalid_value_for(
                "RedrivePolicy", text, f"Redrive policy does not contain mandatory attribute: {key}."
            )
    if isinstance(count, str) and count.strip().isdigit():
        count = int(count.strip())
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_RECEIVE_COUNT:
        raise e.invalid_value_for(
            "RedrivePolicy",
            text,
            f"Invalid value for maxReceiveCount: {count}, valid values are from 1 to {MAX_RECEIVE_COUNT} "
            "both inclusive.",
        )
    target = queue_of_arn(arn, account) if isinstance(arn, str) else None
    if target is None:
        raise e.invalid_value_for("RedrivePolicy", text, "Dead letter target does not exist.")
    return RedrivePolicy(str(arn).strip(), target, count)


def parse_allow_policy(text: str, account: str) -> AllowPolicy | None:
    """A RedriveAllowPolicy as set (empty: the default, every queue of the account may use it)."""
    if not text.strip():
        return None
    data = _json_map("RedriveAllowPolicy", text)
    permission = data.get("redrivePermission")
    if permission not in (ALLOW_ALL, DENY_ALL, BY_QUEUE):
        raise e.invalid_value_for(
            "RedriveAllowPolicy", text, "redrivePermission must be one of allowAll, denyAll or byQueue."
        )
    arns = data.get("sourceQueueArns")
    if permission != BY_QUEUE:
        if arns:
            raise e.invalid_value_for(
                "RedriveAllowPolicy", text, f"sourceQueueArns is only allowed with {BY_QUEUE}."
            )
        return AllowPolicy(str(permission), frozenset(), ())
    if not isinstance(arns, list) or not 1 <= len(arns) <= MAX_ALLOWED_SOURCES:
        raise e.invalid_value_for(
            "RedriveAllowPolicy",
            text,
            f"{BY_QUEUE} needs sourceQueueArns: 1 to {MAX_ALLOWED_SOURCES} queue ARNs.",
        )
    names: set[str] = set()
    for arn in arns:
        name = queue_of_arn(arn, account) if isinstance(arn, str) else None
        if name is None:
            raise e.invalid_value_for(
                "RedriveAllowPolicy", text, f"{arn} is not a queue ARN of this account."
            )
        names.add(name)
    return AllowPolicy(BY_QUEUE, frozenset(names), tuple(str(a) for a in arns))


# --- move tasks --------------------------------------------------------------------------------
RUNNING: Final = "RUNNING"
COMPLETED: Final = "COMPLETED"
CANCELLING: Final = "CANCELLING"
CANCELLED: Final = "CANCELLED"
FAILED: Final = "FAILED"

# Moves up to n messages of the task's source, answering how many it moved (0: none left).
MoveStep = Callable[["MoveTask", int], Awaitable[int]]


@dataclass(slots=True)
class MoveTask:
    handle: str
    source: str  # the dead-letter queue's name
    source_arn: str
    destination: str | None  # a queue's name, or None: each message back to where it came from
    destination_arn: str | None
    rate_per_s: int | None
    to_move: int
    started_ms: int
    moved: int = 0
    status: str = RUNNING
    failure: str = ""
    runner: asyncio.Task[None] | None = field(default=None, repr=False)
    # Set by CancelMessageMoveTask: the task ends between steps, so no message is left both
    # sent on and still in the source, or received and hidden by a step cut short.
    cancelled: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def entry(self) -> dict[str, Any]:
        """As ListMessageMoveTasks answers it."""
        out: dict[str, Any] = {
            "TaskHandle": self.handle,
            "Status": self.status,
            "SourceArn": self.source_arn,
            "ApproximateNumberOfMessagesMoved": self.moved,
            "ApproximateNumberOfMessagesToMove": self.to_move,
            "StartedTimestamp": self.started_ms,
        }
        if self.destination_arn:
            out["DestinationArn"] = self.destination_arn
        if self.rate_per_s is not None:
            out["MaxNumberOfMessagesPerSecond"] = self.rate_per_s
        if self.failure:
            out["FailureReason"] = self.failure
        return out


def _handle(source_arn: str) -> str:
    raw = msgspec.json.encode({"taskId": str(uuid.uuid4()), "sourceArn": source_arn})
    return base64.b64encode(raw).decode()


class MoveTasks:
    """The move tasks this gateway runs, by dead-letter queue (its topic, so one account's
    queue never meets another's)."""

    def __init__(self) -> None:
        self._by_source: dict[str, list[MoveTask]] = {}
        self._by_handle: dict[str, MoveTask] = {}

    def start(
        self,
        source_topic: str,
        task: MoveTask,
        step: MoveStep,
    ) -> None:
        tasks = self._by_source.setdefault(source_topic, [])
        if any(t.status in (RUNNING, CANCELLING) for t in tasks):
            raise SqsError(
                e.UNSUPPORTED_OPERATION,
                "There is already a task running. Only one active task is allowed for a source queue "
                "arn at a given time.",
            )
        tasks.insert(0, task)
        for old in tasks[KEEP_FINISHED_TASKS:]:
            self._by_handle.pop(old.handle, None)
        del tasks[KEEP_FINISHED_TASKS:]
        self._by_handle[task.handle] = task
        task.runner = asyncio.get_running_loop().create_task(self._run(task, step))

    def listed(self, source_topic: str, limit: int) -> list[MoveTask]:
        return self._by_source.get(source_topic, [])[:limit]

    def find(self, handle: str) -> MoveTask:
        task = self._by_handle.get(handle)
        if task is None:
            raise SqsError(e.RESOURCE_NOT_FOUND, "Task does not exist.")
        return task

    async def cancel(self, handle: str) -> MoveTask:
        task = self.find(handle)
        if task.status != RUNNING:
            raise SqsError(
                e.UNSUPPORTED_OPERATION, f"Only a RUNNING task can be cancelled; this one is {task.status}."
            )
        task.status = CANCELLING
        task.cancelled.set()
        if task.runner is not None:
            await asyncio.shield(task.runner)
        return task

    async def stop(self) -> None:
        """End every running task (the gateway stops): what they had received comes back."""
        for task in list(self._by_handle.values()):
            if task.runner is not None and not task.runner.done():
                task.runner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task.runner

    @staticmethod
    async def _run(task: MoveTask, step: MoveStep) -> None:
        started = time.monotonic()
        try:
            while task.moved < task.to_move and not task.cancelled.is_set():
                want = min(MOVE_STEP, task.to_move - task.moved)
                if task.rate_per_s is not None:
                    want = min(want, task.rate_per_s)
                    # Paced: the n-th message no sooner than n / rate seconds after the start.
                    ahead = task.moved / task.rate_per_s - (time.monotonic() - started)
                    if ahead > 0:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(task.cancelled.wait(), ahead)
                        continue
                moved = await step(task, want)
                if moved == 0:
                    break
                task.moved += moved
            task.status = CANCELLED if task.cancelled.is_set() else COMPLETED
        except asyncio.CancelledError:
            task.status = CANCELLED
            raise
        except SqsError as exc:
            task.status, task.failure = FAILED, exc.message
            log.warning(
                "sqs move task from %s failed after %d messages: %s", task.source, task.moved, exc.message
            )
        except Exception as exc:
            task.status, task.failure = FAILED, type(exc).__name__
            log.exception("sqs move task from %s failed after %d messages", task.source, task.moved)


def new_task(
    source: str,
    source_arn: str,
    destination: str | None,
    destination_arn: str | None,
    rate_per_s: int | None,
    to_move: int,
    now_ms: int,
) -> MoveTask:
    return MoveTask(
        _handle(source_arn), source, source_arn, destination, destination_arn, rate_per_s, to_move, now_ms
    )
