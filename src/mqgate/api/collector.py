"""The garbage collector tuned for a gateway process.

CPython's default collects the youngest generation every 700 net allocations of container
objects. A produce or pull allocates hundreds (messages, receipts, futures, trace batches), so
the collector ran many times per request batch and, every tenth and hundredth time, rescanned
the older generations: the registry, the indexes and every live connection. Under `wrk` that
was 25-30 % of the throughput of batched produces and most of their p99 (benchmarks/HISTORY.md,
2026-11-25: batches of 100 went from 117k to 164k msgs/s, p99 from 39 to 14 ms). A gateway
makes little cyclic garbage (requests are freed by reference counting), so collecting less
often costs no memory that matters.
"""

from __future__ import annotations

import gc
from typing import Final

# (youngest, middle, oldest): collections of each generation per collection of the younger one.
THRESHOLDS: Final = (10_000, 50, 100)


def tune_for_serving() -> None:
    """For the process that serves (`mqgate serve` and its workers), not for library users."""
    gc.set_threshold(*THRESHOLDS)


def collector_off_while_starting() -> None:
    """No collections while the process loads and builds what it serves with (`serving_collector`
    turns it back on): what the start makes lives as long as the process, and a pass over it
    finds nothing to free."""
    gc.disable()


def serving_collector() -> None:
    """Once the app is built: what exists now is moved out of the collector's sight
    (`gc.freeze`: no later pass walks it again) and collections resume at the serving
    thresholds."""
    gc.freeze()
    tune_for_serving()
    gc.enable()
