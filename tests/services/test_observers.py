"""The seam between the data path and the features (services/observers.py): per hook, only the
attached observers that do something; tracing attached only while a trace policy exists."""

from __future__ import annotations

import asyncio
from pathlib import Path

from mqgate.backends import backends_for
from mqgate.metrics import Metrics
from mqgate.registry.cache import RegistryCache
from mqgate.registry.records import ConsumerRecord, PolicyRecord
from mqgate.registry.sql import SqlRegistry
from mqgate.services.context import Context
from mqgate.services.observers import HOOKS, Observer, Observers
from mqgate.services.topology import Topology
from mqgate.settings import load_settings
from mqgate.tracing.service import Tracing


class CountsAcks(Observer):
    def __init__(self) -> None:
        self.acked_by: list[str] = []

    def acked(self, c: ConsumerRecord, queue: int, count: int) -> None:
        self.acked_by.append(c.name)


def test_a_hook_lists_only_the_observers_that_override_it() -> None:
    counts = CountsAcks()
    observers = Observers(Observer(), counts)
    assert observers.acked == (counts.acked,)
    assert all(getattr(observers, hook) == () for hook in HOOKS if hook != "acked")
    observers.attach(counts)  # twice: once
    assert len(observers.acked) == 1
    observers.detach(counts)
    assert observers.acked == () and not observers.is_attached(counts)


def test_every_hook_of_observer_is_indexed() -> None:
    assert set(HOOKS) == {
        "records_with", "stored", "produced", "produce_failed", "spooled", "held", "stored_qos",
        "came_due", "pulled", "delivered", "acked", "settled", "batch_hop", "redriven", "read",
    }  # fmt: skip
    observers = Observers()
    for hook in HOOKS:
        assert getattr(observers, hook) == ()


def test_tracing_is_attached_to_the_data_path_only_while_a_policy_exists(tmp_path: Path) -> None:
    async def go() -> None:
        settings = load_settings(env={}, data_dir=tmp_path / "data", admin_token="x")
        backends = backends_for(settings)
        registry = RegistryCache(SqlRegistry(settings.resolved_registry_url()), 3600)
        ctx = Context(
            settings, backends.store, backends.offsets, backends.scheduler, registry, Metrics(), b"k" * 32
        )
        observers = Observers()
        tracing = Tracing(ctx, Topology(ctx), observers)
        tracing.policies_changed([])
        assert not observers.is_attached(tracing.observer)
        assert observers.records_with == () and observers.delivered == () and observers.settled == ()
        policy = PolicyRecord("p", "project", "info", "shop", None, None, None, 0)
        tracing.policies_changed([policy])
        assert observers.is_attached(tracing.observer)
        assert observers.delivered == (tracing.observer.delivered,)
        tracing.policies_changed([])
        assert not observers.is_attached(tracing.observer) and observers.delivered == ()

    asyncio.run(go())
