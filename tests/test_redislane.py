"""The lane (redislane.py): the data path's commands on one pipelined connection, answering as
redis-py's client does, on a redis-server of the test's own."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest
from redis import exceptions as rexc

from mqgate import redisio
from mqgate.errors import Unavailable
from mqgate.redislane import Lane
from tests.conftest import RedisServer, free_port, run_bounded

TIMEOUT_S = 2.0  # a command's time for its answer (a hung server's)


def lane_for(srv: RedisServer, **kwargs: Any) -> Lane:
    return Lane("127.0.0.1", srv.port, timeout_s=TIMEOUT_S, connect_timeout_s=5.0, **kwargs)


def test_replies_errors_and_many_commands_at_once_as_redis_py_gives_them(own_redis: RedisServer) -> None:
    async def go() -> None:
        lane = lane_for(own_redis)
        client = redisio.connect(own_redis.url)
        try:
            assert await lane.execute("SET", "k", b"\x00\xff") == b"OK"
            assert await lane.execute_many(("GET", "k"), ("HSET", "h", "a", 1), ("HGETALL", "h")) == [
                b"\x00\xff",
                1,
                [b"a", b"1"],
            ]
            with pytest.raises(rexc.ResponseError, match="WRONGTYPE"):
                await lane.execute("HGET", "k", "a")
            with pytest.raises(rexc.NoScriptError):
                await lane.execute("EVALSHA", "0" * 40, 0)
            # A script the server does not have is loaded, then run (a new or restarted server).
            script = client.register_script("return {KEYS[1], ARGV[1]}")
            got = await redisio.run_script(client, script, ["k"], [7], None)
            assert got == [b"k", b"7"]
            # A caller that went away does not shift the replies of the ones after it.
            slow = asyncio.ensure_future(lane.execute("BLPOP", "absent", "0.2"))
            await asyncio.sleep(0.05)
            slow.cancel()
            assert await lane.execute("GET", "k") == b"\x00\xff"
        finally:
            lane.close()
            await client.aclose()

    run_bounded(go(), 60)


async def until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def calls_of(lane: Lane, command: str) -> int:
    stats = (await lane.execute("INFO", "commandstats")).decode()
    for line in stats.splitlines():
        if line.startswith(f"cmdstat_{command}:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


async def until_blocked(admin: Lane) -> None:
    deadline = asyncio.get_running_loop().time() + 10
    while b"blocked_clients:1" not in await admin.execute("INFO", "clients"):
        assert asyncio.get_running_loop().time() < deadline, "the BLPOP never blocked"
        await asyncio.sleep(0.01)


def test_a_restarted_server_costs_no_error_and_a_down_one_is_unavailable(own_redis: RedisServer) -> None:
    async def go() -> None:
        lane = lane_for(own_redis)
        try:
            assert await lane.execute("SET", "k", "v") == b"OK"
            own_redis.kill9()
            own_redis.start()  # the same port, the same files
            # A read that meets the dead connection is sent once more, on a new one.
            assert await lane.execute("GET", "k", reads=True) == b"v"
            own_redis.kill9()
            own_redis.start()
            await until(lambda: not lane.connected, 10, "the lost connection to be noticed")
            assert await lane.execute("SET", "k", "w") == b"OK"  # on a new connection
            own_redis.kill9()
            with pytest.raises(Unavailable), redisio.translated("reading"):
                await lane.execute("GET", "k")
        finally:
            lane.close()

    run_bounded(go(), 60)


def test_a_command_written_before_its_connection_went_is_not_sent_again(own_redis: RedisServer) -> None:
    """As redis-py's client (no retries): it may have run, so it fails, once."""

    async def go() -> None:
        lane, admin = lane_for(own_redis), lane_for(own_redis)
        try:
            lane_id = await lane.execute("CLIENT", "ID")
            before = await calls_of(admin, "blpop")
            waiting = asyncio.ensure_future(lane.execute("BLPOP", "absent", "5"))
            await until_blocked(admin)
            assert await admin.execute("CLIENT", "KILL", "ID", lane_id) == 1
            with pytest.raises(rexc.ConnectionError):
                await waiting
            assert await calls_of(admin, "blpop") == before + 1
            assert await lane.execute("PING") == b"PONG"  # the next command: a new connection
        finally:
            lane.close()
            admin.close()

    run_bounded(go(), 60)


def test_a_closed_lane_fails_what_waits_and_sends_nothing_more(own_redis: RedisServer) -> None:
    async def go() -> None:
        lane, admin = lane_for(own_redis), lane_for(own_redis)
        try:
            before = await calls_of(admin, "blpop")
            pings = await calls_of(admin, "ping")
            waiting = asyncio.ensure_future(lane.execute("BLPOP", "absent", "5"))
            await until_blocked(admin)
            lane.close()
            with pytest.raises(rexc.ConnectionError):
                await waiting
            with pytest.raises(rexc.ConnectionError):
                await lane.execute("PING")
            assert not lane.connected
            assert await calls_of(admin, "blpop") == before + 1
            assert await calls_of(admin, "ping") == pings
        finally:
            admin.close()

    run_bounded(go(), 60)


def test_a_server_that_refuses_the_connection_is_an_error_not_a_hang(own_redis: RedisServer) -> None:
    async def go() -> None:
        admin = lane_for(own_redis)
        try:
            await admin.execute("CONFIG", "SET", "maxclients", "1")  # the admin's is the one
            for _ in range(3):
                with pytest.raises(Unavailable), redisio.translated("reading"):
                    await lane_for(own_redis).execute("PING")
        finally:
            await admin.execute("CONFIG", "SET", "maxclients", "10000")
            admin.close()

    run_bounded(go(), 60)


def test_a_server_that_stops_answering_times_out_command_by_command(
    own_redis: RedisServer,
) -> None:
    async def go() -> None:
        lane = lane_for(own_redis)
        assert own_redis.proc is not None
        try:
            assert await lane.execute("PING") == b"PONG"
            os.kill(own_redis.proc.pid, signal.SIGSTOP)
            try:
                with pytest.raises(Unavailable, match="did not answer"), redisio.translated("reading"):
                    await lane.execute("PING")
                # A command sent after that one timed out has its own time: not failed with it.
                young = asyncio.ensure_future(lane.execute("ECHO", "young"))
                await asyncio.sleep(0)
            finally:
                os.kill(own_redis.proc.pid, signal.SIGCONT)
            assert await young == b"young"
            assert await lane.execute("PING") == b"PONG"
        finally:
            lane.close()

    run_bounded(go(), 60)


def test_a_password_and_a_database_are_sent_first(own_redis: RedisServer) -> None:
    async def go() -> None:
        admin = lane_for(own_redis)
        assert await admin.execute("CONFIG", "SET", "requirepass", "s3cret") == b"OK"
        admin.close()
        lane = lane_for(own_redis, password="s3cret", db=3)
        client = redisio.connect(f"redis://:s3cret@127.0.0.1:{own_redis.port}/3")
        try:
            assert await lane.execute("SET", "k", "in-3") == b"OK"
            assert await client.get("k") == b"in-3"  # redis-py's connection to db 3 sees it
            own = redisio.lane_of(client)
            assert own is not None and await own.execute("GET", "k") == b"in-3"
            with pytest.raises(rexc.AuthenticationError):
                await lane_for(own_redis, password="wrong").execute("PING")
        finally:
            lane.close()
            await client.aclose()

    run_bounded(go(), 60)


def test_nothing_listening_is_a_connection_error() -> None:
    async def go() -> None:
        lane = Lane("127.0.0.1", free_port(), timeout_s=TIMEOUT_S, connect_timeout_s=5.0)
        with pytest.raises(Unavailable), redisio.translated("reading"):
            await lane.execute("PING")

    run_bounded(go(), 30)


def test_only_a_plain_tcp_client_has_a_lane() -> None:
    assert redisio.lane_of(redisio.connect("redis://127.0.0.1:1/0")) is not None
    assert redisio.lane_of(redisio.connect("unix:///tmp/nowhere.sock")) is None
    assert redisio.lane_of(redisio.connect("rediss://127.0.0.1:1/0")) is None
    assert redisio.lane_of(redisio.connect("redis+cluster://127.0.0.1:1,127.0.0.1:2")) is None
    # A URL's options that change the replies' shapes: redis-py's path, which knows them.
    assert redisio.lane_of(redisio.connect("redis://127.0.0.1:1/0?decode_responses=True")) is None


def test_closing_idle_connections_closes_an_idle_lane_and_leaves_a_busy_one(own_redis: RedisServer) -> None:
    async def go() -> None:
        client = redisio.connect(own_redis.url)
        lane = redisio.lane_of(client)
        assert lane is not None
        try:
            before = await lane.execute("CLIENT", "ID")
            busy = asyncio.ensure_future(lane.execute("BLPOP", "absent", "0.2"))
            await asyncio.sleep(0.05)
            await redisio.close_idle_connections(client)
            assert await busy is None  # the busy connection was left to its command
            assert await lane.execute("CLIENT", "ID") == before
            await redisio.close_idle_connections(client)
            assert await lane.execute("CLIENT", "ID") != before  # idle: closed, then another
        finally:
            await client.aclose()

    run_bounded(go(), 60)
