"""What one observation costs on the hot path with 10 000 queues tracked (a measured figure,
printed; the bound asserted is loose, to catch a regression to IO or locking, not to benchmark)."""

from __future__ import annotations

import time

from mqgate.queuestate.sampler import QueueStateSampler

B = 1_700_000_040_000
QUEUES = 10_000
CALLS = 200_000


def per_call_us(run: object, calls: int) -> float:
    best = float("inf")
    for _ in range(3):  # best of three: the figure is the cost, not the machine's noise
        started = time.perf_counter()
        run()  # type: ignore[operator]
        best = min(best, time.perf_counter() - started)
    return best / calls * 1e6


def test_one_observe_call_costs_a_few_microseconds_with_10k_queues() -> None:
    s = QueueStateSampler()
    keys = [(f"project-{i % 50}", f"topic-{i // 16}", i % 16) for i in range(QUEUES)]
    consumers = [(p, f"group-{t}", t, q) for p, t, q in keys]
    for p, t, q in keys:
        s.observe_queue(p, t, q, 1, B)
    for p, c, t, q in consumers:
        s.observe_backlog(p, c, t, q, 1, B)
    assert s.tracked_keys() == 2 * QUEUES
    rounds = CALLS // QUEUES

    def observe_queue() -> None:
        obs = s.observe_queue
        for r in range(rounds):
            now = B + 1 + r
            for p, t, q in keys:
                obs(p, t, q, r, now)

    def observe_backlog() -> None:
        obs = s.observe_backlog
        for r in range(rounds):
            now = B + 1 + r
            for p, c, t, q in consumers:
                obs(p, c, t, q, r, now)

    def count_pull() -> None:
        pull = s.count_pull
        for r in range(rounds):
            now = B + 1 + r
            for p, c, t, q in consumers:
                pull(p, c, t, q, 1, now)

    def count_produce() -> None:
        produce = s.count_produce
        for r in range(rounds):
            now = B + 1 + r
            for p, t, _ in keys:
                produce(p, t, True, None, now)

    def loop_only() -> None:  # the test's own loop, subtracted from the figures
        for r in range(rounds):
            now = B + 1 + r
            for p, t, q in keys:
                (p, t, q, r, now)  # noqa: B018

    base = per_call_us(loop_only, CALLS)
    figures = {
        name: per_call_us(run, CALLS) - base
        for name, run in [
            ("observe_queue", observe_queue),
            ("observe_backlog", observe_backlog),
            ("count_pull", count_pull),
            ("count_produce", count_produce),
        ]
    }
    # The recorder's roll-up: steps of 500 keys, the event loop served in between.
    step_ms: list[float] = []
    started = time.perf_counter()
    for _ in s.sweep(B + 60_000):
        step_ms.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
    step_ms.append((time.perf_counter() - started) * 1000)
    rollup = s.take_closed()
    assert len(rollup.queues) == QUEUES and len(rollup.consumers) == QUEUES
    print(
        "\nqueue state cost, 10k queues + 10k consumer keys: "
        + ", ".join(f"{name} {us:.2f} µs" for name, us in figures.items())
        + f"; roll-up of {len(rollup)} rows {sum(step_ms):.1f} ms in {len(step_ms)} steps,"
        + f" longest {max(step_ms):.1f} ms"
    )
    assert all(us < 20 for us in figures.values()), figures
