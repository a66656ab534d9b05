"""Issue 27 item 1: a project's topics, side topics, inboxes and offset tables exist on the
cluster it switched to before that cluster takes its traffic. During a switch under load some
produces got `404 topic ft does not exist` and pulls `404 topic %INBOX%orders-c does not exist`:
the data path followed the new switch record at once, while the declaration there was still
under way (or had failed and waited for the next round).

Deterministic: the primary is killed -9 and the switch check is run by the test; a produce and
a pull arrive after the record names the backup and before this gateway has handled the switch
(the coordinator's `on_switch`, which declares the project there)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mqgate.errors import MqgateError
from mqgate.failover.switch import SwitchEvent
from mqgate.model import decode_stored
from tests.conftest import run_bounded
from tests.failover.conftest import FailoverRedis
from tests.failover.harness import in_process


def test_traffic_between_the_switch_record_and_its_declaration_waits_for_the_declaration(
    tmp_path: Path, redis_pair: tuple[FailoverRedis, FailoverRedis]
) -> None:
    primary, backup = redis_pair

    async def go() -> None:
        async with in_process(tmp_path / "gw", primary.url, backup.url) as h:
            assert {r.status for r in await h.produce(["m0", "m1"])} == {"stored"}
            primary.kill9()
            h.fail("p")
            seen: dict[str, Any] = {}
            switched = h.failover.coordinator.on_switch
            assert switched is not None

            async def traffic_first(event: SwitchEvent) -> None:
                # The record names b; this gateway has not handled the switch yet.
                for what, call in (("produce", lambda: h.produce(["after"])), ("pull", h.pull)):
                    try:
                        seen[what] = await call()
                    except MqgateError as exc:
                        seen[what] = exc
                await switched(event)

            h.failover.coordinator.on_switch = traffic_first
            await h.failover.coordinator.check()
            assert h.active() == "b" and h.epoch() == 2
            produced, pulled = seen["produce"], seen["pull"]
            errors = [f"{w}: {e!r}" for w, e in seen.items() if isinstance(e, MqgateError)]
            assert not errors, errors
            assert [(r.status, r.broker) for r in produced] == [("stored", "b")]
            assert pulled.status == "FOUND" and pulled.messages is not None
            assert [decode_stored(r).body for _, r in pulled.messages] == ["after"]

    run_bounded(go(), 120)
