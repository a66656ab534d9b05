"""Console users and their grants, in the registry's database. Synchronous and short: the
console calls these in a worker thread, the CLI directly."""

from __future__ import annotations

import time

import msgspec
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from mqgate.console import tables as t
from mqgate.console.passwords import check_new_password, dummy_hash, hash_password, verify_password
from mqgate.console.roles import Grant, Principal, check_grant
from mqgate.errors import AlreadyExists, BadRequest, NotFound, Unavailable
from mqgate.names import validate_name


def now_ms() -> int:
    return int(time.time() * 1000)


class UserRow(msgspec.Struct, frozen=True):
    name: str
    provider: str
    created_ms: int
    grants: tuple[Grant, ...]


class Accounts:
    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def add(self, name: str, password: str, role: str, project: str) -> UserRow:
        validate_name(name, "name")
        why = check_new_password(password) or check_grant(role, project)
        if why:
            raise BadRequest(why, field="password" if "password" in why else "role")
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    sa.insert(t.users).values(
                        name=name, password_hash=hash_password(password), created_ms=now_ms()
                    )
                )
                conn.execute(sa.insert(t.grants).values(user_name=name, role=role, project=project))
        except IntegrityError as exc:
            raise AlreadyExists(f"user {name} already exists", field="name") from exc
        except SQLAlchemyError as exc:
            raise Unavailable(f"console database error: {exc}") from exc
        return self.get(name)

    def get(self, name: str) -> UserRow:
        found = self.list([name])
        if not found:
            raise NotFound(f"user {name} does not exist", field="name")
        return found[0]

    def list(self, names: list[str] | None = None) -> list[UserRow]:
        query = sa.select(t.users).order_by(t.users.c.name)
        if names is not None:
            query = query.where(t.users.c.name.in_(names))
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(query).all()
                granted: dict[str, list[Grant]] = {}
                for g in conn.execute(sa.select(t.grants).order_by(t.grants.c.project, t.grants.c.role)):
                    granted.setdefault(g.user_name, []).append(Grant(g.role, g.project))
        except SQLAlchemyError as exc:
            raise Unavailable(f"console database error: {exc}") from exc
        return [UserRow(r.name, r.provider, r.created_ms, tuple(granted.get(r.name, []))) for r in rows]

    def delete(self, name: str) -> None:
        with self.engine.begin() as conn:
            if conn.execute(sa.delete(t.users).where(t.users.c.name == name)).rowcount == 0:
                raise NotFound(f"user {name} does not exist", field="name")
            conn.execute(sa.delete(t.grants).where(t.grants.c.user_name == name))
            conn.execute(sa.delete(t.sessions).where(t.sessions.c.user_name == name))

    def set_password(self, name: str, password: str) -> None:
        why = check_new_password(password)
        if why:
            raise BadRequest(why, field="password")
        with self.engine.begin() as conn:
            stmt = sa.update(t.users).where(t.users.c.name == name)
            if conn.execute(stmt.values(password_hash=hash_password(password))).rowcount == 0:
                raise NotFound(f"user {name} does not exist", field="name")
            # A new password ends every session of the old one.
            conn.execute(sa.delete(t.sessions).where(t.sessions.c.user_name == name))

    def grant(self, name: str, role: str, project: str) -> None:
        why = check_grant(role, project)
        if why:
            raise BadRequest(why, field="role")
        self.get(name)
        try:
            with self.engine.begin() as conn:
                conn.execute(sa.insert(t.grants).values(user_name=name, role=role, project=project))
        except IntegrityError:
            pass  # granted already

    def revoke(self, name: str, role: str, project: str) -> None:
        with self.engine.begin() as conn:
            stmt = sa.delete(t.grants).where(
                t.grants.c.user_name == name, t.grants.c.role == role, t.grants.c.project == project
            )
            if conn.execute(stmt).rowcount == 0:
                raise NotFound(f"user {name} has no {role} grant on {project}", field="role")

    def verify(self, name: str, password: str) -> Principal | None:
        """The user if the password is theirs. An unknown name costs the same KDF run as a
        wrong password, so the time does not tell which it was."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(t.users).where(t.users.c.name == name)).first()
        stored = row.password_hash if row is not None and row.password_hash else dummy_hash()
        ok = verify_password(password, stored)
        if row is None or not row.password_hash or not ok:
            return None
        return self.principal(name)

    def principal(self, name: str) -> Principal | None:
        found = self.list([name])
        return Principal(name, found[0].grants) if found else None
