"""What is checked and set up before any gateway process starts (`mqgate serve` runs it once,
before its workers): the data directory, the Redis store's reachability, the registry's tables
and the secrets every gateway shares. Light on purpose: the serve command of N workers imports
this and not the app, which each worker imports for itself."""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path

from mqgate.errors import StorageError
from mqgate.registry.sql import SqlRegistry
from mqgate.settings import Settings


def _shared_secret(registry: SqlRegistry, name: str, path: Path, make: str, announce: str = "") -> str:
    """A secret shared by every gateway through the registry, with a copy in the data directory
    (mode 0600) for the CLI. An existing copy from an older version becomes the shared value."""
    try:
        local: str | None = path.read_text().strip()
    except FileNotFoundError:
        local = None
    value = registry.shared_secret(name, local or make)
    if value != local:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(value + "\n")
        os.replace(tmp, path)
        if announce and value == make:
            print(announce.format(value=value, path=path), flush=True)
    return value


def admin_token_for(settings: Settings, registry: SqlRegistry) -> str:
    if settings.admin_token:
        return settings.admin_token
    return _shared_secret(
        registry,
        "admin_token",
        Path(settings.data_dir) / "admin.token",
        "mqa_" + secrets.token_urlsafe(32),
        "mqgate: generated admin token {value} (kept in {path}; set MQGATE_ADMIN_TOKEN to choose one)",
    )


def token_secret_for(settings: Settings, registry: SqlRegistry) -> bytes:
    if settings.token_secret:
        return settings.token_secret.encode()
    return _shared_secret(
        registry, "ack_secret", Path(settings.data_dir) / "secret.key", secrets.token_hex(32)
    ).encode()


def stored_data(settings: Settings) -> list[Path]:
    """Files of the embedded backends that hold data (messages, consumer offsets)."""
    if settings.uses_redis:
        return []
    root = Path(settings.data_dir)
    candidates = [*root.glob("topics/*/*/*.log"), root / "offsets" / "journal.log"]
    return [p for p in candidates if p.is_file() and p.stat().st_size > 0]


def open_registry(settings: Settings) -> SqlRegistry:
    """The registry, its tables created; refused when it is empty while the data directory
    holds data: a lost or truncated registry must not start as a new one (every name would
    answer 404 and new registrations would reuse the old data's names)."""
    registry = SqlRegistry(settings.resolved_registry_url())
    try:
        data = stored_data(settings)
        if data and registry.is_empty():
            raise StorageError(
                f"the registry ({settings.resolved_registry_url()}) holds no topics, but the data "
                f"directory {settings.data_dir} holds data ({len(data)} files, e.g. {data[0]}): "
                "refusing to start as new. Restore the registry (registry.db) from a backup, or "
                "move the data directory away to start afresh; `mqgate check` reports what is there."
            )
        registry.create_schema()
    except BaseException:
        registry.dispose()
        raise
    return registry


def prepare(settings: Settings) -> None:
    """Checks and one-time setup before any gateway process starts: fail early and clearly."""
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
    if settings.uses_redis:
        from mqgate import redisio  # an extra: only a Redis store needs it

        asyncio.run(redisio.check_reachable(settings.store))
    registry = open_registry(settings)
    try:
        admin_token_for(settings, registry)
        token_secret_for(settings, registry)
    finally:
        registry.dispose()
