"""The console charts' metrics history (mqgate.metrics_history): when a sample is due,
and that a chart drawn just after a minute turned ends in a point with data."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mqgate import metrics_history
from mqgate.backends import backends_for
from mqgate.metrics import Metrics
from mqgate.metrics_history import MetricsHistory, sample_due
from mqgate.registry.cache import RegistryCache
from mqgate.registry.sql import SqlRegistry
from mqgate.services.context import Context
from mqgate.settings import load_settings

MINUTE_MS = 60_000
T0 = 1_800_000_000_000 - 1_800_000_000_000 % MINUTE_MS  # the start of a minute


def test_a_sample_is_due_after_its_interval_or_when_a_new_minute_began() -> None:
    assert not sample_due(T0 + 10_000, T0 + 9_500, 1.0)  # half a second, same minute
    assert sample_due(T0 + 10_000, T0 + 9_000, 1.0)  # a second
    assert sample_due(T0 + MINUTE_MS + 200, T0 + MINUTE_MS - 500, 1.0)  # 0.7 s, a new minute
    assert not sample_due(T0 + MINUTE_MS - 1, T0, 60.0)
    assert sample_due(T0, T0, 0.0)


def test_a_chart_drawn_just_after_the_minute_turned_ends_with_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = {"ms": T0 + MINUTE_MS - 10_000}
    monkeypatch.setattr(metrics_history, "_now_ms", lambda: clock["ms"])
    settings = load_settings(env={}, data_dir=tmp_path / "data", admin_token="x")
    backends = backends_for(settings)
    registry = RegistryCache(SqlRegistry(settings.resolved_registry_url()), 3600)
    ctx = Context(
        settings, backends.store, backends.offsets, backends.scheduler, registry, Metrics(), b"k" * 32
    )
    history = MetricsHistory(ctx, url=f"sqlite:///{tmp_path / 'history.sqlite'}", source="gw")

    async def go() -> None:
        await history.start()
        try:
            clock["ms"] += 9_500  # half a second before the minute turns
            ctx.metrics.produced.labels(topic="t").inc(30)
            await history.sample(at_least_s=1.0)  # what a page does: the overview...
            clock["ms"] += 700  # ...and the charts page 0.7 s later, in the next minute
            ctx.metrics.produced.labels(topic="t").inc(7)
            await history.sample(at_least_s=1.0)
            points = await history.series("hour", clock["ms"])
        finally:
            await history.stop()
        assert points[-1].at_ms == T0 + MINUTE_MS
        assert points[-1].produce_rate == pytest.approx(7 * 1000 / 700)
        assert points[-2].produce_rate == pytest.approx(30 * 1000 / 9_500)

    asyncio.run(go())
