"""What every Redis adapter shares: the client, Lua scripts from files, error translation.

Scripts live as `.lua` files beside the adapter that runs them. A script may start with
`--! include <name>.lua` lines; each names a file of shared local functions in the same
folder, pasted in front of the script (Lua scripts cannot import one another).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from importlib import resources
from typing import Any, Final

import redis.asyncio as aioredis
from redis import exceptions as rexc

from mqgate.errors import StorageError, Unavailable

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
