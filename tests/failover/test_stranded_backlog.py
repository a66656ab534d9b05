"""Issue 27 item 5: a consumer's lag read 0 while messages acknowledged to its producers sat,
unconsumed, on the failed primary: lag is measured on the project's active cluster only. The
backlog left on a cluster the project moved away from is shown as such: `stranded`, per
cluster, with whether it was measured just now (the cluster answers) or is the last figure
measured before the cluster failed, and the gauge `mqgate_consumer_stranded_messages`.

Deterministic: the measuring round (`measure_backlogs`, every few switch checks in a gateway)
and the switch are driven by the test."""

from __future__ import annotations

from pathlib import Path

import msgspec
from prometheus_client import generate_latest

from mqgate.api.limits import SettingsLimits
from mqgate.api.routes_admin import AdminRoutes
from mqgate.api.shapes import ProgressIn
from mqgate.web.request import Request
from tests.conftest import run_bounded
from tests.failover.conftest import FailoverRedis
from tests.failover.harness import InProcess, in_process


def gauge(h: InProcess, cluster: str) -> float | None:
    text = generate_latest(h.gateway.ctx.metrics.registry).decode()
    label = f'mqgate_consumer_stranded_messages{{cluster="{cluster}",consumer="orders-c"}} '
    for line in text.splitlines():
        if line.startswith(label):
            return float(line[len(label) :])
    return None


def test_the_backlog_left_on_a_failed_cluster_is_shown_as_stranded_not_as_no_lag(
    tmp_path: Path, redis_pair: tuple[FailoverRedis, FailoverRedis]
) -> None:
    primary, backup = redis_pair

    async def go() -> None:
        async with in_process(tmp_path / "gw", primary.url, backup.url) as h:
            await h.produce([f"m{i}" for i in range(10)])
            assert (await h.gateway.operations.progress("orders-c")).lag == 10
            await h.failover.measure_backlogs()  # a gateway does this every few switch checks
            assert await h.failover.stranded("orders-c") == []  # p is the active cluster

            primary.kill9()
            h.fail("p")
            await h.failover.coordinator.check()
            assert h.active() == "b"
            # The symptom: lag, measured on the active cluster, is 0.
            assert (await h.gateway.operations.progress("orders-c")).lag == 0
            (on_p,) = await h.failover.stranded("orders-c")
            assert (on_p.cluster, on_p.state, on_p.messages, on_p.live) == ("p", "failed", 10, False)
            assert on_p.measured_ms > 0
            assert gauge(h, "p") == 10
            # ... and in the consumer's progress as the API answers it
            routes = AdminRoutes(h.gateway, SettingsLimits(h.gateway.ctx.settings), h.failover.stranded)
            answer = await routes.progress(Request("GET", "/", {}, "", input=ProgressIn(name="orders-c")))
            shown = msgspec.to_builtins(answer.result)
            assert (shown["lag"], shown["stranded"][0]["cluster"], shown["stranded"][0]["messages"]) == (
                0,
                "p",
                10,
            )

            primary.start()
            await h.rejoin("p")  # back, not drained yet: measured there now
            (on_p,) = await h.failover.stranded("orders-c")
            assert (on_p.cluster, on_p.messages, on_p.live) == ("p", 10, True)

            await h.failover.drain_left()  # moved to the consumer's inbox on b: lag again
            assert await h.failover.stranded("orders-c") == []
            assert gauge(h, "p") is None
            assert (await h.gateway.operations.progress("orders-c")).lag == 10

    run_bounded(go(), 120)
