"""The access keys' tables, in the registry's database (created on demand, next to the
registry's tables, never touching them)."""

from __future__ import annotations

from typing import Final

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from mqgate.sqlschema import create_all_shared

meta: Final = sa.MetaData()

access_keys = sa.Table(
    "mqgate_access_keys",
    meta,
    sa.Column("access_key_id", sa.String(32), primary_key=True),
    # A revoked key keeps its row (and its name): the list says who had which key until when.
    sa.Column("name", sa.String(128), nullable=False, unique=True),
    sa.Column("project", sa.String(128), nullable=False, index=True),
    sa.Column("sealed_secret", sa.String(512), nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("revoked_ms", sa.BigInteger, nullable=True),
)
# One row, moved by every create and revoke: a gateway learns whether its copy of the keys is
# current with one cheap query, whatever the gateways' clocks say.
version = sa.Table(
    "mqgate_access_keys_version",
    meta,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("version", sa.BigInteger, nullable=False),
)


def create_tables(engine: sa.Engine) -> None:
    create_all_shared(meta, engine)
    try:
        with engine.begin() as conn:
            if conn.execute(sa.select(version.c.version)).first() is None:
                conn.execute(sa.insert(version).values(id=1, version=1))
    except IntegrityError:
        pass  # another gateway made the row at the same moment
