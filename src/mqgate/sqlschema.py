"""Creating SQL tables when several processes may do it at the same moment.

`create_all` looks for each table, then creates the missing ones. Gateway processes started
together (`serve --workers N`, or several gateways on one registry) can all see a table missing;
every CREATE but the first then fails (SQLite: "table ... already exists"; PostgreSQL: a unique
violation on pg_type, or DuplicateTable). Looking again finds the other process's table, so the
loser tries again instead of dying at start-up.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

ATTEMPTS = 5


def create_all_shared(meta: sa.MetaData, engine: sa.Engine) -> None:
    """`meta.create_all(engine)`, safe against other processes creating the same tables."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            meta.create_all(engine, checkfirst=True)
            return
        except (IntegrityError, OperationalError, ProgrammingError) as exc:
            lost_a_race = isinstance(exc, IntegrityError) or "already exists" in str(exc.orig)
            if not lost_a_race or attempt == ATTEMPTS:
                raise
