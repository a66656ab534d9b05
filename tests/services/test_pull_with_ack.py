"""A pull that carries an ack (`requestId`) acks and leases in one step (`ack_and_lease`); what
the ack did is answered, counted and told whatever the lease meet after it. Broadcast clients on
the real embedded backends, in process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from mqgate.api.shapes import MessageIn
from mqgate.backends import backends_for
from mqgate.core.tokens import AckToken
from mqgate.errors import Unavailable
from mqgate.metrics import Metrics
from mqgate.registry.cache import RegistryCache
from mqgate.registry.records import ConsumerRecord
from mqgate.registry.sql import SqlRegistry
from mqgate.services import consume
from mqgate.services.consume import FOUND, PullResult
from mqgate.services.context import Context, now_ms
from mqgate.services.gateway import Gateway
from mqgate.services.observers import Observer, Settlement
from mqgate.settings import load_settings
from tests.conftest import run_bounded

WEEK_MS = 7 * 86_400_000
WOKEN_WITHIN_S = 20.0  # a waiting pull woken by an ack answers at once; unwoken, after RECHECK_S
RECHECK_S = 120.0


@asynccontextmanager
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    settings = load_settings(env={}, data_dir=tmp_path / "data", admin_token="x")
    backends = backends_for(settings)
    registry = RegistryCache(SqlRegistry(settings.resolved_registry_url()), 3600)
    ctx = Context(
        settings, backends.store, backends.offsets, backends.scheduler, registry, Metrics(), b"k" * 32
    )
    gw = Gateway(ctx)
    await backends.start()
    await gw.start()
    try:
        await gw.topology.create_topic("t", 1, WEEK_MS, None)
        await gw.topology.register_consumer("c", "t", "broadcast", "earliest", 60, 16)
        producer, _ = await gw.topology.register_producer("p", "t")
        await gw.producing.produce(producer, [MessageIn(body=f"m{i}") for i in range(40)])
        yield gw
    finally:
        await gw.stop()
        await backends.stop()


async def pull(gw: Gateway, client: str, request_id: str | None = None, wait_s: float = 0.0) -> PullResult:
    c = await gw.topology.consumer("c")
    return await gw.consuming.pull(
        c, client_id=client, max_count=5, wait_s=wait_s, request_id=request_id, owner="o"
    )


def acks_ok(gw: Gateway) -> float:
    return gw.ctx.metrics.child(gw.ctx.metrics.acks, "c", "ok").value  # type: ignore[no-any-return]


def test_an_ack_of_another_clients_batch_wakes_that_clients_waiting_pull(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Client b pulls with client a's requestId: a's queue is free again, and a's waiting pull is
    woken, although b's own lease took the queue of the same number in b's table."""
    monkeypatch.setattr(consume, "LOCK_RECHECK_S", RECHECK_S)  # no re-check wakes it instead

    async def go() -> None:
        async with gateway(tmp_path) as gw:
            first = await pull(gw, "a")
            assert first.status == FOUND and first.request_id is not None
            waiting = asyncio.ensure_future(pull(gw, "a", wait_s=RECHECK_S))
            await asyncio.sleep(0)  # the waiting pull finds a's one queue locked and waits
            b = await pull(gw, "b", request_id=first.request_id)
            assert (b.status, b.ack) == (FOUND, "ok")
            woken = await asyncio.wait_for(waiting, WOKEN_WITHIN_S)
            assert woken.status == FOUND and woken.messages is not None
            assert [o for o, _ in woken.messages] == [5, 6, 7, 8, 9]

    run_bounded(go(), 90)


def test_an_ack_is_answered_and_counted_when_the_pulls_own_table_had_expired(tmp_path: Path) -> None:
    """Client b's table expired (an idle broadcast client); b pulls with client a's requestId:
    the ack is done, answered ok and counted, and b's table is made again for its lease."""

    async def go() -> None:
        async with gateway(tmp_path) as gw:
            await pull(gw, "b")
            seen_b = now_ms()
            await asyncio.sleep(0.01)
            first = await pull(gw, "a")
            assert first.request_id is not None
            assert await gw.ctx.offsets.expire_clients("c", seen_b + 1) == ["b"]
            before = acks_ok(gw)
            b = await pull(gw, "b", request_id=first.request_id)
            assert (b.status, b.ack) == (FOUND, "ok")
            assert acks_ok(gw) == before + 1
            table = await gw.ctx.offsets.table("c", "a")
            assert table is not None and table[0].committed == 5
            again = await pull(gw, "b", request_id=first.request_id)
            assert again.ack == "already_acked"

    run_bounded(go(), 90)


class FailingRecord(Observer):
    """A feature whose record of an ack fails, as a trace written to a failing cluster does."""

    async def settled(
        self, c: ConsumerRecord, token: AckToken, how: Settlement, durable: bool, refusal: str | None
    ) -> None:
        raise Unavailable("the trace store is down")


def test_a_failed_record_of_the_ack_does_not_keep_the_batch_leased_with_it(tmp_path: Path) -> None:
    """The batch the pull leased with its ack is delivered, and the record's failure counted as a
    fault; before, the pull failed and its batch stayed locked until its lock timed out."""

    async def go() -> None:
        async with gateway(tmp_path) as gw:
            first = await pull(gw, "a")
            assert first.request_id is not None
            gw.observers.attach(FailingRecord())
            second = await pull(gw, "a", request_id=first.request_id)
            assert (second.status, second.ack) == (FOUND, "ok")
            assert second.messages is not None and [o for o, _ in second.messages] == [5, 6, 7, 8, 9]
            assert gw.ctx.health.count("consume", "ack_observer") == 1
            # Nothing leased with the ack (the last batch): the pull fails with the record's error.
            rest = [await pull(gw, "a", request_id=second.request_id)]
            with pytest.raises(Unavailable):
                while rest[-1].status == FOUND:
                    assert rest[-1].request_id is not None
                    rest.append(await pull(gw, "a", request_id=rest[-1].request_id))

    run_bounded(go(), 90)
