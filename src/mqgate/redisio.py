"""What every Redis adapter shares: the client, Lua scripts from files, error translation.

Three deployments, chosen by the URL's scheme (docs/CLUSTERS.md):
- `redis://`, `rediss://`, `unix://`: one Redis (redis-py's `Redis`);
- `redis+cluster://[user:password@]host:port[,host:port...]`: a Redis Cluster, the hosts are
  seed nodes (redis-py's asyncio `RedisCluster`, which follows MOVED/ASK and failovers);
- `redis+sentinel://[user:password@]host:port[,host:port...]/SERVICE[/DB]`: the primary of
  SERVICE as the Sentinels name it (a `Redis` whose pool asks them on every new connection).

Scripts live as `.lua` files beside the adapter that runs them. A script may start with
`--! include <name>.lua` lines; each names a file of shared local functions in the same
folder, pasted in front of the script (Lua scripts cannot import one another).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Iterator
from importlib import resources
from typing import Any, Final, TypeAlias

import msgspec
import redis.asyncio as aioredis
from redis import exceptions as rexc
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import Connection
from redis.asyncio.sentinel import Sentinel

try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # redis without its hiredis extra
    _hiredis_pack = None  # type: ignore[assignment]

from mqgate.errors import BadRequest, StorageError, Unavailable
from mqgate.redislane import Lane
from mqgate.urls import redact

log = logging.getLogger(__name__)

INCLUDE: Final = "--! include "
SOCKET_TIMEOUT_S: Final = 5.0
CLUSTER_SCHEME: Final = "redis+cluster://"
SENTINEL_SCHEME: Final = "redis+sentinel://"
# A script + WAIT pair redirected while a slot moves is sent again, this many times at most.
REDIRECT_TRIES: Final = 40
REDIRECT_PAUSE_S: Final = 0.05
CLUSTER_REDIRECTIONS: Final = 64

RedisClient: TypeAlias = aioredis.Redis | RedisCluster


class ReplicaWait(msgspec.Struct, frozen=True):
    """Answer a write only once `replicas` replicas have it (`WAIT`), or fail after `timeout_ms`."""

    replicas: int
    timeout_ms: int


class _Address(msgspec.Struct, frozen=True):
    nodes: list[tuple[str, int]]
    username: str | None
    password: str | None
    path: list[str]


def _parse_multi_host(url: str, scheme: str) -> _Address:
    rest = url[len(scheme) :].split("?", 1)[0].split("#", 1)[0]
    netloc, _, path = rest.partition("/")
    username = password = None
    if "@" in netloc:
        creds, _, netloc = netloc.rpartition("@")
        user, colon, secret = creds.partition(":")
        username, password = (user or None), (secret if colon else None)
        if not colon:  # `redis://secret@host` is a password, as redis-py reads it
            username, password = None, user
    nodes = []
    for part in netloc.split(","):
        host, colon, port = part.strip().rpartition(":")
        if not colon or not host or not port.isdigit():
            raise BadRequest(f"{redact(url)}: each node must be host:port, not {part!r}", field="store")
        nodes.append((host.strip("[]"), int(port)))
    return _Address(nodes, username, password, [p for p in path.split("/") if p])


def _timeouts(options: dict[str, Any]) -> dict[str, Any]:
    return {
        "socket_timeout": options.pop("socket_timeout", SOCKET_TIMEOUT_S),
        "socket_connect_timeout": options.pop("socket_connect_timeout", SOCKET_TIMEOUT_S),
        "health_check_interval": options.pop("health_check_interval", 30),
    }


def is_cluster_url(url: str) -> bool:
    return url.startswith(CLUSTER_SCHEME)


def connect(url: str, **options: Any) -> RedisClient:
    """A pooled client that returns bytes; a broken connection is retried on the next call."""
    timeouts = _timeouts(options)
    if url.startswith(CLUSTER_SCHEME):
        where = _parse_multi_host(url, CLUSTER_SCHEME)
        cluster = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in where.nodes],
            # A MOVED only corrects the slot table. By default every 5th MOVED closes every
            # connection of the client, under the feet of the other calls in flight.
            reinitialize_steps=0,
            username=where.username,
            password=where.password,
            **timeouts,
            **options,
        )
        # Redirections (MOVED, ASK, TRYAGAIN) one call follows before it fails: 16 by default,
        # which a slot migrating under load can use up (ASKING goes on a pooled connection
        # that may not be the command's, and the target then answers MOVED).
        cluster.RedisClusterRequestTTL = CLUSTER_REDIRECTIONS
        return _cluster_packing_in_c(cluster)
    if url.startswith(SENTINEL_SCHEME):
        where = _parse_multi_host(url, SENTINEL_SCHEME)
        if not where.path:
            raise BadRequest(
                f"{redact(url)}: name the service: redis+sentinel://host:port/SERVICE", field="store"
            )
        db = int(where.path[1]) if len(where.path) > 1 else 0
        sentinels = Sentinel(  # type: ignore[no-untyped-call]
            where.nodes,
            sentinel_kwargs={k: timeouts[k] for k in ("socket_timeout", "socket_connect_timeout")},
        )
        client: aioredis.Redis = sentinels.master_for(
            where.path[0], username=where.username, password=where.password, db=db, **timeouts, **options
        )
        return _packing_in_c(client)
    plain = LanedRedis.from_url(url, **timeouts, **options)
    assert isinstance(plain, LanedRedis)
    kwargs = plain.connection_pool.connection_kwargs  # the URL's query options are in them
    # Plain TCP with the client's usual reply shapes (RESP2, bytes): the lane answers the same.
    plain_tcp = plain.connection_pool.connection_class is Connection
    if plain_tcp and not kwargs.get("decode_responses") and kwargs.get("protocol") in (None, 2, "2"):
        plain.lane = Lane(
            kwargs.get("host", "localhost"),
            int(kwargs.get("port", 6379)),
            password=kwargs.get("password"),
            username=kwargs.get("username"),
            db=int(kwargs.get("db") or 0),
            timeout_s=float(kwargs.get("socket_timeout") or timeouts["socket_timeout"]),
            connect_timeout_s=float(
                kwargs.get("socket_connect_timeout") or timeouts["socket_connect_timeout"]
            ),
            on_lost=plain.drop_idle_connections,
        )
    return _packing_in_c(plain)


class LanedRedis(aioredis.Redis):
    """A client of a standalone Redis, whose data-path commands go on its lane when it has one
    (`lane_of`, redislane.py); closed with it."""

    lane: Lane | None = None
    _dropping: asyncio.Task[None] | None = None

    def drop_idle_connections(self) -> None:
        """The lane lost its connection (a restarted or hung server): the pool's idle ones most
        likely went with it, and each would fail its next command; they are closed now."""
        self._dropping = asyncio.get_running_loop().create_task(self._drop_idle())

    async def _drop_idle(self) -> None:
        try:
            await self.connection_pool.disconnect(inuse_connections=False)
        except Exception as exc:  # a connection that fails to close is gone as well
            log.debug("closing the pool's idle connections after the lane's was lost: %r", exc)

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        if self.lane is not None:
            self.lane.close()
        await super().aclose(close_connection_pool)


def lane_of(client: RedisClient) -> Lane | None:
    """The lane of `client` (a standalone Redis over TCP), or None: use the client itself."""
    return client.lane if isinstance(client, LanedRedis) else None


def _packing_in_c(client: aioredis.Redis) -> aioredis.Redis:
    """`client`, its commands packed by hiredis. redis-py's asyncio connections pack in Python
    (its blocking ones use hiredis): a batch produce's script call of 200 arguments took 124 µs
    to pack against 26 µs, a fifth of the request's CPU (benchmarks/RESULTS.md). Without
    hiredis the client stays as it is."""
    if _hiredis_pack is not None:
        pool = client.connection_pool
        pool.connection_class = _packed_class(pool.connection_class)
    return client


def _cluster_packing_in_c(cluster: RedisCluster) -> RedisCluster:
    """`_packing_in_c` for a cluster client: each node makes its connections from the class in
    the client's connection options, one dict the client shares with the nodes it finds later;
    the startup nodes were made before (tests/test_redisio.py checks every node's class)."""
    if _hiredis_pack is not None:
        packed = _packed_class(cluster.connection_kwargs["connection_class"])
        cluster.connection_kwargs["connection_class"] = packed
        for node in [*cluster.startup_nodes, *cluster.nodes_manager.startup_nodes.values()]:
            node.connection_class = packed
    return cluster


_PACKED: dict[type, type] = {}


def _packed_class(cls: type[Any]) -> type[Any]:
    """A subclass of the connection class `cls` whose `pack_command` is hiredis's."""
    packed = _PACKED.get(cls)
    if packed is None:
        packed = _PACKED[cls] = type(f"HiredisPacked{cls.__name__}", (cls,), {"pack_command": _pack_command})
    return packed


def _pack_command(self: Any, *args: Any) -> list[bytes]:
    """redis-py's `pack_command` (a first argument with spaces is several words), by hiredis."""
    assert _hiredis_pack is not None
    first = args[0]
    if isinstance(first, str):
        args = (*first.encode().split(), *args[1:])
    elif b" " in first:
        args = (*first.split(), *args[1:])
    try:
        return [_hiredis_pack(args)]
    except TypeError as exc:  # as redis-py's own encoder: a value of a type Redis cannot take
        raise rexc.DataError(str(exc)) from exc


async def close_idle_connections(client: RedisClient) -> None:
    """Close the idle connections of `client`'s pool (a Redis Cluster client: each node's);
    connections in use are left to the call holding them (a dead one fails that call and is
    dropped). The next call opens a fresh one."""
    if isinstance(client, RedisCluster):
        for node in client.get_nodes():
            closed = node.disconnect_free_connections()
            if asyncio.iscoroutine(closed):
                await closed
        return
    lane = lane_of(client)
    if lane is not None:
        lane.close_if_idle()
    await client.connection_pool.disconnect(inuse_connections=False)


def subscriber(client: RedisClient, **options: Any) -> tuple[PubSub, aioredis.Redis | None]:
    """A pub/sub connection for `client`, and the extra client to close after it (or None).

    On a cluster, PUBLISH (and a script's PUBLISH) reaches every node, so one plain
    connection to any node hears every channel; a random node each time, so a listener
    that reconnects after its node died finds a live one."""
    if isinstance(client, RedisCluster):
        node = random.choice(client.get_nodes())
        kept = ("username", "password", "socket_timeout", "socket_connect_timeout", "ssl")
        options_of_node = {k: v for k, v in node.connection_kwargs.items() if k in kept}
        own = aioredis.Redis(host=node.host, port=int(node.port), **options_of_node)
        return own.pubsub(**options), own
    return client.pubsub(**options), None


def script_source(package: str, name: str) -> str:
    """The text of `<package>/<name>`, with its includes pasted in front."""
    folder = resources.files(package)
    text = (folder / name).read_text()
    parts = []
    body = []
    for line in text.splitlines():
        if line.startswith(INCLUDE):
            parts.append((folder / line[len(INCLUDE) :].strip()).read_text())
        else:
            body.append(line)
    return "\n".join([*parts, *body]) + "\n"


def register(client: RedisClient, package: str, name: str) -> Any:
    """A redis-py Script object (EVALSHA, reloaded on NOSCRIPT after a Redis restart)."""
    return client.register_script(script_source(package, name))


async def run_script(
    client: RedisClient, script: Any, keys: list[Any], args: list[Any], wait: ReplicaWait | None
) -> Any:
    """Run a registered script; with `wait`, answer only once enough replicas have its writes.

    WAIT counts the replicas that have the writes of the connection it is sent on, so the
    script and the WAIT go in one pipeline to one node (on a cluster: the master of the
    keys' slot). A pair that meets MOVED/ASK/TRYAGAIN did not run and is sent again."""
    if wait is None:
        lane = lane_of(client)
        if lane is None:
            return await script(keys=keys, args=args)
        try:
            return await lane.execute("EVALSHA", script.sha, len(keys), *keys, *args)
        except rexc.NoScriptError:  # a new or restarted server: load it, then run it
            await lane.execute("SCRIPT", "LOAD", script.script)
            return await lane.execute("EVALSHA", script.sha, len(keys), *keys, *args)
    for _ in range(REDIRECT_TRIES):
        if isinstance(client, RedisCluster):
            await client.initialize()  # the slot table: empty until the client's first command
            node = client.get_node_from_key(keys[0])
            cpipe = client.pipeline(transaction=False)
            cpipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            cpipe.execute_command("WAIT", wait.replicas, wait.timeout_ms, target_nodes=node)
            result, acked = await cpipe.execute(raise_on_error=False, allow_redirections=False)
        else:
            async with client.pipeline(transaction=False) as pipe:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
                pipe.wait(wait.replicas, wait.timeout_ms)
                result, acked = await pipe.execute(raise_on_error=False)
        if isinstance(result, rexc.NoScriptError):
            await client.script_load(script.script)
            continue
        if isinstance(result, (rexc.MovedError, rexc.AskError, rexc.TryAgainError)):
            assert isinstance(client, RedisCluster)
            if isinstance(result, rexc.MovedError):
                await client.nodes_manager.initialize()
            await asyncio.sleep(REDIRECT_PAUSE_S)
            continue
        if isinstance(result, Exception):
            raise result
        if isinstance(acked, Exception):
            raise acked
        if int(acked) < wait.replicas:
            raise Unavailable(
                f"written, but {acked} of {wait.replicas} replicas confirmed it within "
                f"{wait.timeout_ms} ms: it may be lost if the primary fails now"
            )
        return result
    raise Unavailable("redis cluster: the keys' slot kept moving; try again")


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    """Turn Redis failures into `Unavailable` (retry later) or `StorageError`."""
    try:
        yield
    except (
        rexc.ConnectionError,
        rexc.TimeoutError,
        rexc.ReadOnlyError,
        rexc.ClusterError,  # a cluster's retries ran out (a failover in progress)
        rexc.RedisClusterException,  # no node reachable, or a slot not served yet
    ) as exc:
        raise Unavailable(f"redis unavailable during {what}: {exc}") from exc
    except rexc.ResponseError as exc:
        if str(exc).startswith(("LOADING", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN")):
            raise Unavailable(f"redis not ready during {what}: {exc}") from exc
        raise StorageError(f"redis error during {what}: {exc}") from exc
    except rexc.RedisError as exc:
        raise StorageError(f"redis error during {what}: {exc}") from exc
    except (AttributeError, RuntimeError) as exc:
        # redis-py's cluster client closes its connections when the cluster changes (a
        # failover), and a call in flight on one of them fails this way: retry later.
        if not _raised_in_redis_py(exc):
            raise
        raise Unavailable(f"redis connection closed during {what}: {exc!r}") from exc


def _raised_in_redis_py(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if "/redis/asyncio/" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


async def check_reachable(url: str, timeout_s: float = 3.0) -> None:
    """Raise `Unavailable` naming the URL (without its password) if Redis does not answer."""
    client = connect(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        with translated(f"connecting to {redact(url)}"):
            await client.ping()
    finally:
        await client.aclose()


LISTEN_IDLE_S: Final = 10.0  # a quiet listener pings this often
LISTEN_DEAD_S: Final = 3 * LISTEN_IDLE_S
RECONNECT_MIN_S: Final = 0.05
RECONNECT_MAX_S: Final = 2.0


async def listen_forever(
    client: RedisClient,
    channel: str,
    on_message: Callable[[bytes, bytes], Awaitable[None] | None],
    on_reconnect: Callable[[], Awaitable[None] | None],
    listening: asyncio.Event,
    what: str,
    *,
    pattern: bool = False,
) -> None:
    """Call `on_message(channel, data)` for each message published on `channel` (a glob with
    `pattern`), reconnecting for ever (never raises but CancelledError); after a reconnect,
    `on_reconnect` (what was published meanwhile is lost). A connection that died silently is
    noticed by pinging."""
    delay = RECONNECT_MIN_S
    reconnecting = False
    loop = asyncio.get_running_loop()
    kind = b"pmessage" if pattern else b"message"
    while True:
        pubsub, own = subscriber(client)
        try:
            await (pubsub.psubscribe(channel) if pattern else pubsub.subscribe(channel))
            listening.set()
            if reconnecting:
                log.info("%s reconnected", what)
                await _maybe_await(on_reconnect())
            delay = RECONNECT_MIN_S
            heard = loop.time()
            while True:
                msg = await pubsub.parse_response(block=False, timeout=LISTEN_IDLE_S)
                if msg is None:
                    if loop.time() - heard > LISTEN_DEAD_S:
                        raise rexc.ConnectionError(f"no answer for {LISTEN_DEAD_S:.0f}s")
                    await pubsub.ping()
                    continue
                heard = loop.time()
                if msg[0] == kind:
                    await _maybe_await(on_message(msg[-2], msg[-1]))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Loudly once per outage, then quietly while Redis stays away.
            level = logging.WARNING if listening.is_set() or not reconnecting else logging.DEBUG
            log.log(level, "%s: %s; reconnecting in %.2fs", what, exc, delay)
        finally:
            reconnecting = True
            listening.clear()
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            if own is not None:
                with contextlib.suppress(Exception):
                    await own.aclose()
        await asyncio.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, RECONNECT_MAX_S)


async def _maybe_await(value: Awaitable[None] | None) -> None:
    if value is not None:
        await value
