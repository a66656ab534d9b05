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


# Spark's Murmur3 (x86, 32-bit) constants and the seed of its hash() and hash partitioning.
_C1 = 0xCC9E2D51
_C2 = 0x1B873593
_MASK = 0xFFFFFFFF
SPARK_HASH_SEED = 42


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def spark_hash_int(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's `hash()` of an IntegerType value (Murmur3_x86_32.hashInt), as a signed int."""
    k1 = _rotl((value & _MASK) * _C1 & _MASK, 15) * _C2 & _MASK
    h1 = _rotl((seed & _MASK) ^ k1, 13)
    h1 = (h1 * 5 + 0xE6546B64) & _MASK
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


def partition_tags(tasks: int) -> list[int]:
    """For each task t < `tasks`, an int that `DataFrame.repartition(tasks, column)` sends to
    partition t (Spark puts a row in pmod(hash(column), tasks)). Rows tagged with these land
    one task per partition; tagging them with t itself could put two tasks in one partition
    and leave another idle."""
    tags: list[int] = []
    for task in range(tasks):
        candidate = 0
        while spark_hash_int(candidate) % tasks != task:
            candidate += 1
        tags.append(candidate)
    return tags
