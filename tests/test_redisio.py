"""The Redis client's commands packed by hiredis, byte for byte as redis-py packs them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio.connection import Connection, UnixDomainSocketConnection
from redis.exceptions import DataError

from mqgate import redisio
from tests.conftest import MACHINE_REDIS, require_service

COMMANDS: list[tuple[Any, ...]] = [
    ("SET", b"k", b"\x00\xff binary"),
    ("CONFIG GET", "maxmemory"),  # one argument of two words, as redis-py splits it
    (b"CLIENT SETNAME", b"x"),
    ("EVALSHA", "a" * 40, 2, "k1", "k2", -3, 0.1, 1.5e20, "é ü", b"", memoryview(b"view")),
    ("XADD", "s", "1-1", *(["t", 1_796_004_846_334, "d", '{"body":"' + "x" * 7000 + '"}'] * 3)),
]


def test_a_clients_commands_are_packed_by_hiredis_as_redis_py_packs_them() -> None:
    client = redisio.connect("redis://127.0.0.1:1/0")  # packing connects nowhere
    conn = client.connection_pool.make_connection()
    assert type(conn).pack_command is not Connection.pack_command, "packed in Python"
    for command in COMMANDS:
        assert b"".join(conn.pack_command(*command)) == b"".join(Connection.pack_command(conn, *command))
    for bad in (None, True, object()):
        with pytest.raises(DataError):
            conn.pack_command("SET", "k", bad)
    unix = redisio.connect("unix:///tmp/nowhere.sock").connection_pool.make_connection()
    assert isinstance(unix, UnixDomainSocketConnection) and type(unix).pack_command is type(conn).pack_command


def test_commands_packed_by_hiredis_round_trip_through_redis() -> None:
    require_service("127.0.0.1", 6379, "Redis")

    async def go() -> None:
        client = redisio.connect(MACHINE_REDIS)
        try:
            key = "mqtest-redisio-é key"
            value = b"\x00\xff" + "é".encode() * 3000
            assert await client.set(key, value, ex=60)
            assert await client.get(key) == value
            assert await client.execute_command("CONFIG GET", "port") == {"port": "6379"}
            script = "return {KEYS[1], ARGV[1], ARGV[2], ARGV[3]}"
            got = await client.eval(script, 1, key, -3, 0.5, "ü")
            assert got == [key.encode(), b"-3", b"0.5", "ü".encode()]
            async with client.pipeline(transaction=False) as pipe:
                pipe.get(key)
                pipe.delete(key)
                assert await pipe.execute() == [value, 1]
        finally:
            await client.aclose()

    asyncio.run(go())
