"""What every Redis adapter shares: the client, Lua scripts from files, error translation.

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
from typing import Any, Final

import redis.asyncio as aioredis
from redis import exceptions as rexc

from mqgate.errors import StorageError, Unavailable

log = logging.getLogger(__name__)

INCLUDE: Final = "--! include "
SOCKET_TIMEOUT_S: Final = 5.0


def connect(url: str, **options: Any) -> aioredis.Redis:
    """A pooled client that returns bytes; a broken connection is retried on the next call."""
    return aioredis.Redis.from_url(
        url,
        socket_timeout=options.pop("socket_timeout", SOCKET_TIMEOUT_S),
        socket_connect_timeout=options.pop("socket_connect_timeout", SOCKET_TIMEOUT_S),
        health_check_interval=options.pop("health_check_interval", 30),
        **options,
    )


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


def register(client: aioredis.Redis, package: str, name: str) -> Any:
    """A redis-py Script object (EVALSHA, reloaded on NOSCRIPT after a Redis restart)."""
    return client.register_script(script_source(package, name))


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    """Turn Redis failures into `Unavailable` (retry later) or `StorageError`."""
    try:
        yield
    except (rexc.ConnectionError, rexc.TimeoutError, rexc.ReadOnlyError) as exc:
        raise Unavailable(f"redis unavailable during {what}: {exc}") from exc
    except rexc.ResponseError as exc:
        if str(exc).startswith(("LOADING", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN")):
            raise Unavailable(f"redis not ready during {what}: {exc}") from exc
        raise StorageError(f"redis error during {what}: {exc}") from exc
    except rexc.RedisError as exc:
        raise StorageError(f"redis error during {what}: {exc}") from exc


async def check_reachable(url: str, timeout_s: float = 3.0) -> None:
    """Raise `Unavailable` naming the URL (without its password) if Redis does not answer."""
    client = connect(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        with translated(f"connecting to {redact(url)}"):
            await client.ping()
    finally:
        await client.aclose()


def redact(url: str) -> str:
    """The URL with any password replaced, fit for logs and error messages."""
    scheme, sep, rest = url.partition("://")
    if "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{host}" if ":" in creds else f"{scheme}{sep}{creds}@{host}"


LISTEN_IDLE_S: Final = 10.0  # a quiet listener pings this often
LISTEN_DEAD_S: Final = 3 * LISTEN_IDLE_S
RECONNECT_MIN_S: Final = 0.05
RECONNECT_MAX_S: Final = 2.0


async def listen_forever(
    client: aioredis.Redis,
    channel: str,
    on_message: Callable[[bytes], Awaitable[None]],
    on_reconnect: Callable[[], Awaitable[None]],
    listening: asyncio.Event,
    what: str,
) -> None:
    """Call `on_message` with each message published on `channel`, reconnecting for ever
    (never raises but CancelledError); after a reconnect, `on_reconnect` (what was published
    meanwhile is lost). A connection that died silently is noticed by pinging."""
    delay = RECONNECT_MIN_S
    reconnecting = False
    loop = asyncio.get_running_loop()
    while True:
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe(channel)
            listening.set()
            if reconnecting:
                log.info("%s reconnected", what)
                await on_reconnect()
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
                if msg[0] == b"message":
                    await on_message(msg[2])
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
        await asyncio.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, RECONNECT_MAX_S)
