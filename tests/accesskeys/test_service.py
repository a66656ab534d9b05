"""Access keys on a real SQLite registry database: their ids, secrets and accounts, the secret
sealed at rest, names unique, and two gateways' copies: a key made through one works on the
other at once, a revoke takes effect on the other once its copy is `refresh_s` old (a clock the
test moves, no waiting)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa

from mqgate.accesskeys import tables
from mqgate.accesskeys.sealing import Sealer
from mqgate.accesskeys.service import AccessKeys, account_of, could_be_access_key_id
from mqgate.errors import AlreadyExists, NotFound

T = TypeVar("T")
GATEWAY_SECRET = b"0123456789abcdef" * 4


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[sa.Engine]:
    made = sa.create_engine(f"sqlite:///{tmp_path / 'registry.db'}")
    yield made
    made.dispose()


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_a_key_has_an_id_a_secret_shown_once_and_its_projects_account(engine: sa.Engine) -> None:
    keys = AccessKeys(engine, GATEWAY_SECRET, wall_ms=lambda: 1_700_000_000_000)
    first = run(keys.create("shop-orders", "shop"))
    second = run(keys.create("shop-billing", "shop"))
    other = run(keys.create("ads", "ads"))
    for issued in (first, second, other):
        assert re.fullmatch(r"MQGA[A-Z2-7]{16}", issued.key.access_key_id)
        assert could_be_access_key_id(issued.key.access_key_id)
        assert len(issued.secret_access_key) == 40
        assert re.fullmatch(r"\d{12}", issued.key.account)
    assert first.key.account == second.key.account == account_of("shop") != other.key.account
    assert first.key.access_key_id != second.key.access_key_id
    assert first.secret_access_key != second.secret_access_key
    assert first.key.created_ms == 1_700_000_000_000 and not first.key.revoked
    listed = run(keys.keys())
    assert [k.name for k in listed] == ["ads", "shop-billing", "shop-orders"]
    assert [k.name for k in run(keys.keys("shop"))] == ["shop-billing", "shop-orders"]


def test_the_account_of_a_project_is_stable() -> None:
    assert account_of("shop") == account_of("shop")
    assert account_of("shop") != account_of("shop2")
    assert len({account_of(f"p{i}") for i in range(1000)}) == 1000


def test_names_are_unique_and_an_unknown_name_cannot_be_revoked(engine: sa.Engine) -> None:
    keys = AccessKeys(engine, GATEWAY_SECRET)
    run(keys.create("k", "shop"))
    with pytest.raises(AlreadyExists) as taken:
        run(keys.create("k", "ads"))
    assert taken.value.field == "name" and taken.value.http_status == 409
    with pytest.raises(NotFound) as unknown:
        run(keys.revoke("nope"))
    assert unknown.value.field == "name"


def test_the_secret_is_sealed_at_rest_and_opens_only_with_the_gateway_secret(engine: sa.Engine) -> None:
    keys = AccessKeys(engine, GATEWAY_SECRET)
    issued = run(keys.create("k", "shop"))
    with engine.connect() as conn:
        stored = conn.execute(sa.select(tables.access_keys.c.sealed_secret)).scalar_one()
    assert issued.secret_access_key not in stored
    assert Sealer(GATEWAY_SECRET).unseal(stored, issued.key.access_key_id) == issued.secret_access_key
    with pytest.raises(ValueError):
        Sealer(GATEWAY_SECRET).unseal(stored, "MQGA" + "A" * 16)  # another key's row
    with pytest.raises(ValueError):
        Sealer(b"another gateway secret").unseal(stored, issued.key.access_key_id)
    # A gateway with another secret cannot use the key: it is unknown there.
    elsewhere = AccessKeys(engine, b"another gateway secret")
    run(elsewhere.ready(issued.key.access_key_id))
    assert elsewhere.secret_for(issued.key.access_key_id) is None


def test_a_revoked_key_has_no_secret_at_once_on_its_own_gateway(engine: sa.Engine) -> None:
    clock = Clock()
    keys = AccessKeys(engine, GATEWAY_SECRET, clock=clock, wall_ms=lambda: 5)
    issued = run(keys.create("k", "shop"))
    key_id = issued.key.access_key_id
    run(keys.ready(key_id))
    assert keys.secret_for(key_id) == issued.secret_access_key
    assert keys.active(key_id) == issued.key
    revoked = run(keys.revoke("k"))
    assert revoked.revoked and revoked.revoked_ms == 5
    assert keys.secret_for(key_id) is None
    assert run(keys.revoke("k")).revoked_ms == 5  # again: it stays revoked as it was
    assert run(keys.keys())[0].revoked


def test_two_gateways_a_new_key_at_once_a_revoke_within_refresh_s(engine: sa.Engine) -> None:
    clock = Clock()
    one = AccessKeys(engine, GATEWAY_SECRET, clock=clock)
    two = AccessKeys(engine, GATEWAY_SECRET, clock=clock, refresh_s=2.0)
    run(two.ready(None))  # its copy: no keys yet
    issued = run(one.create("k", "shop"))
    key_id = issued.key.access_key_id
    assert two.secret_for(key_id) is None
    run(two.ready(key_id))  # an id it does not know: looked up at once
    assert two.secret_for(key_id) == issued.secret_access_key

    run(one.revoke("k"))
    clock.now += 1.0
    run(two.ready(key_id))
    assert two.secret_for(key_id) == issued.secret_access_key  # its copy is 1 s old
    loads = two.reloads
    clock.now += 1.5
    run(two.ready(key_id))
    assert two.secret_for(key_id) is None and two.reloads == loads + 1

    clock.now += 5.0
    run(two.ready(key_id))  # version unchanged: checked, not read again
    assert two.reloads == loads + 1


def test_made_up_ids_cost_no_lookup(engine: sa.Engine) -> None:
    clock = Clock()
    keys = AccessKeys(engine, GATEWAY_SECRET, clock=clock)
    run(keys.ready(None))
    loads = keys.reloads
    for made_up in ("AKIAIOSFODNN7EXAMPLE", "not-a-key", "MQGA" + "a" * 16):
        run(keys.ready(made_up))
        assert keys.secret_for(made_up) is None
    assert keys.reloads == loads
