"""Access keys: issued per project, revoked by name, looked up by access key id on every signed
request.

Each gateway keeps every key in memory (`AccessKeys`), secrets unsealed, so a lookup is one dict
access. The copy is checked against the table's version row before a lookup when it is older
than `refresh_s` (2 s): one `SELECT` of one row, by at most one request at a time (the others
wait for it), and the keys are read again only when the version moved. So a key revoked through
any gateway is refused by every other within `refresh_s` of their next request, and at once by
the gateway that revoked it (its copy is read again after each of its own changes). An access
key id the copy does not know is looked up again at once, at most every `MISS_REFRESH_S`
(0.2 s), so a key created through another gateway works at its first request.

A copy that cannot be checked (the database is down) keeps serving as it was and is checked
again `refresh_s` later, as the registry's copy does; a secret that does not unseal (the
gateway's secret was changed) makes its key unknown, and is logged.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import secrets
import string
import time
from collections.abc import Callable
from typing import Final

import msgspec
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from mqgate.accesskeys import tables as t
from mqgate.accesskeys.sealing import Sealer
from mqgate.errors import AlreadyExists, MqgateError, NotFound, Unavailable

log = logging.getLogger(__name__)

ACCESS_KEY_PREFIX: Final = "MQGA"
ACCESS_KEY_ID_CHARS: Final = 20
SECRET_CHARS: Final = 40
ACCOUNT_DIGITS: Final = 12
REFRESH_S: Final = 2.0
MISS_REFRESH_S: Final = 0.2
# An id that could be one of ours, before anything is looked up: a made-up id costs no query.
_ID_ALPHABET: Final = frozenset(string.ascii_uppercase + "234567")


def account_of(project: str) -> str:
    """The 12-digit account id of a project's keys (the `<account>` of its queue URLs and
    ARNs): the same for every key of the project, on every gateway, from its name alone."""
    digest = hashlib.blake2b(project.encode(), digest_size=8, person=b"mqgate-account").digest()
    return str(int.from_bytes(digest, "big") % 10**ACCOUNT_DIGITS).zfill(ACCOUNT_DIGITS)


def new_access_key_id() -> str:
    """`MQGA` and 16 characters of base32 (80 random bits), upper case like AWS's `AKIA…`."""
    return ACCESS_KEY_PREFIX + base64.b32encode(secrets.token_bytes(10)).decode()


def new_secret_access_key() -> str:
    """40 characters of base64 (240 random bits), the length and alphabet of AWS's secrets."""
    return base64.b64encode(secrets.token_bytes(30)).decode()


def could_be_access_key_id(value: str) -> bool:
    return (
        len(value) == ACCESS_KEY_ID_CHARS
        and value.startswith(ACCESS_KEY_PREFIX)
        and set(value[len(ACCESS_KEY_PREFIX) :]) <= _ID_ALPHABET
    )


class AccessKey(msgspec.Struct, frozen=True):
    name: str
    project: str
    account: str
    access_key_id: str
    created_ms: int
    revoked_ms: int | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_ms is not None


class IssuedKey(msgspec.Struct, frozen=True):
    """A new key with its secret: the only time the secret is answered."""

    key: AccessKey
    secret_access_key: str


class ActiveKey(msgspec.Struct, frozen=True):
    """A key that may sign requests, with its secret (in memory only)."""

    key: AccessKey
    secret_access_key: str


def _key_of(row: sa.Row[tuple[object, ...]]) -> AccessKey:
    m = row._mapping
    return AccessKey(
        name=str(m["name"]),
        project=str(m["project"]),
        account=account_of(str(m["project"])),
        access_key_id=str(m["access_key_id"]),
        created_ms=int(m["created_ms"]),
        revoked_ms=None if m["revoked_ms"] is None else int(m["revoked_ms"]),
    )


class AccessKeyStore:
    """The keys' table: synchronous and short, run in a worker thread by `AccessKeys`."""

    def __init__(self, engine: sa.Engine, gateway_secret: bytes) -> None:
        self.engine = engine
        self.sealer = Sealer(gateway_secret)
        self._created = False

    def _tables(self) -> None:
        if not self._created:
            t.create_tables(self.engine)
            self._created = True

    @staticmethod
    def _bump(conn: sa.Connection) -> None:
        conn.execute(sa.update(t.version).values(version=t.version.c.version + 1))

    def create(self, name: str, project: str, now_ms: int) -> IssuedKey:
        self._tables()
        key = AccessKey(name, project, account_of(project), new_access_key_id(), now_ms)
        secret = new_secret_access_key()
        row = {
            "access_key_id": key.access_key_id,
            "name": name,
            "project": project,
            "sealed_secret": self.sealer.seal(secret, key.access_key_id),
            "created_ms": now_ms,
            "revoked_ms": None,
        }
        try:
            with self.engine.begin() as conn:
                conn.execute(sa.insert(t.access_keys).values(**row))
                self._bump(conn)
        except IntegrityError as exc:
            raise AlreadyExists(f"access key {name} already exists", field="name") from exc
        except SQLAlchemyError as exc:
            raise Unavailable(f"registry database error: {exc}") from exc
        return IssuedKey(key, secret)

    def revoke(self, name: str, now_ms: int) -> AccessKey:
        """The key, revoked now (a key revoked before keeps its time)."""
        self._tables()
        c = t.access_keys.c
        try:
            with self.engine.begin() as conn:
                changed = conn.execute(
                    sa.update(t.access_keys)
                    .where(c.name == name, c.revoked_ms.is_(None))
                    .values(revoked_ms=now_ms)
                ).rowcount
                if changed:
                    self._bump(conn)
                row = conn.execute(sa.select(t.access_keys).where(c.name == name)).first()
        except SQLAlchemyError as exc:
            raise Unavailable(f"registry database error: {exc}") from exc
        if row is None:
            raise NotFound(f"access key {name} does not exist", field="name")
        return _key_of(row)

    def keys(self, project: str | None = None) -> list[AccessKey]:
        """Every key (revoked ones too), by name."""
        self._tables()
        query = sa.select(t.access_keys).order_by(t.access_keys.c.name)
        if project is not None:
            query = query.where(t.access_keys.c.project == project)
        try:
            with self.engine.connect() as conn:
                return [_key_of(r) for r in conn.execute(query)]
        except SQLAlchemyError as exc:
            raise Unavailable(f"registry database error: {exc}") from exc

    def version(self) -> int:
        self._tables()
        try:
            with self.engine.connect() as conn:
                return int(conn.execute(sa.select(t.version.c.version)).scalar_one())
        except SQLAlchemyError as exc:
            raise Unavailable(f"registry database error: {exc}") from exc

    def active(self) -> tuple[int, dict[str, ActiveKey]]:
        """(the version, every key that is not revoked by access key id, secrets unsealed), read
        in one transaction so the version names exactly these keys."""
        self._tables()
        c = t.access_keys.c
        try:
            with self.engine.begin() as conn:
                current = int(conn.execute(sa.select(t.version.c.version)).scalar_one())
                rows = conn.execute(sa.select(t.access_keys).where(c.revoked_ms.is_(None))).all()
        except SQLAlchemyError as exc:
            raise Unavailable(f"registry database error: {exc}") from exc
        found: dict[str, ActiveKey] = {}
        for row in rows:
            key = _key_of(row)
            try:
                secret = self.sealer.unseal(str(row._mapping["sealed_secret"]), key.access_key_id)
            except ValueError as exc:
                log.warning("access key %s (%s) cannot be used: %s", key.name, key.access_key_id, exc)
                continue
            found[key.access_key_id] = ActiveKey(key, secret)
        return current, found


class AccessKeys:
    """The keys as one gateway serves them: changes through the table, lookups from memory
    (see the module for how the copy stays current)."""

    def __init__(
        self,
        engine: sa.Engine,
        gateway_secret: bytes,
        *,
        refresh_s: float = REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.store = AccessKeyStore(engine, gateway_secret)
        self.refresh_s = refresh_s
        self._clock = clock
        self._wall_ms = wall_ms
        self._active: dict[str, ActiveKey] = {}
        self._version = -1
        self._checked_at: float | None = None  # when the last check started (clock)
        self._missed_at: float | None = None
        self._lock = asyncio.Lock()
        self.reloads = 0

    # --- changes --------------------------------------------------------------------------

    async def create(self, name: str, project: str) -> IssuedKey:
        issued = await asyncio.to_thread(self.store.create, name, project, self._wall_ms())
        await self._reload()
        return issued

    async def revoke(self, name: str) -> AccessKey:
        key = await asyncio.to_thread(self.store.revoke, name, self._wall_ms())
        await self._reload()
        return key

    async def keys(self, project: str | None = None) -> list[AccessKey]:
        return await asyncio.to_thread(self.store.keys, project)

    # --- lookups --------------------------------------------------------------------------

    def secret_for(self, access_key_id: str) -> str | None:
        """The secret of a key that may sign (None: unknown or revoked), from memory: the
        lookup `mqgate.sqs.sigv4.verify` takes. Call `ready` first."""
        found = self._active.get(access_key_id)
        return None if found is None else found.secret_access_key

    def active(self, access_key_id: str) -> AccessKey | None:
        found = self._active.get(access_key_id)
        return None if found is None else found.key

    def ready_now(self, access_key_id: str | None) -> bool:
        """Whether `ready(access_key_id)` has nothing to do (a request's usual case, answered
        without the two awaits)."""
        checked = self._checked_at
        return (
            checked is not None
            and access_key_id is not None
            and access_key_id in self._active
            and self._clock() - checked < self.refresh_s
        )

    async def ready(self, access_key_id: str | None) -> None:
        """Make this gateway's copy fit to answer `secret_for(access_key_id)`: checked within
        `refresh_s`, and looked up again (at most every MISS_REFRESH_S) if it lacks the id."""
        await self.fresh()
        if (
            access_key_id is None
            or access_key_id in self._active
            or not could_be_access_key_id(access_key_id)
        ):
            return
        missed = self._clock()
        async with self._lock:
            if access_key_id in self._active or (self._checked_at is not None and self._checked_at > missed):
                return  # a look that started after this miss has ended
            if self._missed_at is not None:
                wait = self._missed_at + MISS_REFRESH_S - self._clock()
                if wait > 0:
                    await asyncio.sleep(wait)  # unknown ids cannot flood the database
            self._missed_at = self._clock()
            await self._check(self._missed_at)

    async def fresh(self) -> None:
        """Check the copy against the table if it is older than `refresh_s`."""
        if self._checked_at is not None and self._clock() - self._checked_at < self.refresh_s:
            return
        async with self._lock:
            now = self._clock()
            if self._checked_at is not None and now - self._checked_at < self.refresh_s:
                return  # another request checked while this one waited
            await self._check(now)

    async def _check(self, started: float) -> None:
        try:
            current = await asyncio.to_thread(self.store.version)
            if current != self._version:
                await self._load()
        except MqgateError as exc:
            log.warning("access keys not checked, keeping this gateway's copy: %s", exc.message)
        self._checked_at = started

    async def _reload(self) -> None:
        """After this gateway's own change: its copy is read again before it answers."""
        async with self._lock:
            started = self._clock()
            try:
                await self._load()
                self._checked_at = started
            except MqgateError as exc:  # the change is made: the next lookup checks again
                log.warning("access keys not read again after a change: %s", exc.message)
                self._checked_at = None

    async def _load(self) -> None:
        self._version, self._active = await asyncio.to_thread(self.store.active)
        self.reloads += 1
