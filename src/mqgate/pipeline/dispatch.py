"""Which worker queue an event goes to (SPEC E2), and which Spark task runs that queue.

The hash must be the same in every process and on every run (Python's `hash()` of a str is
salted per process), or a replayed batch would send a key to another worker.
"""

from __future__ import annotations

import hashlib


def stable_hash(text: str) -> int:
    """A 64-bit hash of `text` that never changes between processes, runs or machines."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def worker_of(key: str, partitions: int) -> int:
    """Key-hash dispatch: all events of one key go to one of the N worker queues."""
    return stable_hash(key) % partitions


def spread_of(event_id: str, partitions: int) -> int:
    """Hot and retry dispatch: no key affinity, events spread evenly over all N workers."""
    return stable_hash(event_id) % partitions


def task_of(worker: int, tasks: int) -> int:
    """Worker queue w runs in Spark task w mod T, so each task drains N/T queues."""
    return worker % tasks


def workers_of_task(task: int, tasks: int, partitions: int) -> list[int]:
    return list(range(task, partitions, tasks))
