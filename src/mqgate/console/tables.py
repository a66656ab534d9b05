"""The console's own tables, in the registry's database (created on demand, next to the
registry's tables, never touching them)."""

from __future__ import annotations

from typing import Any, Final

import sqlalchemy as sa

from mqgate.sqlschema import create_all_shared

meta: Final = sa.MetaData()

users = sa.Table(
    "mqgate_console_users",
    meta,
    sa.Column("name", sa.String(128), primary_key=True),
    # "scrypt$n$r$p$salt$hash", or "" for a user who signs in elsewhere (OIDC, later).
    sa.Column("password_hash", sa.String(256), nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    # Which identity provider vouches for this user ("password" here; an OIDC issuer later).
    sa.Column("provider", sa.String(64), nullable=False, server_default="password"),
)
# (user, role, project): project "*" is every project; admin is only ever granted on "*".
grants = sa.Table(
    "mqgate_console_grants",
    meta,
    sa.Column("user_name", sa.String(128), primary_key=True),
    sa.Column("role", sa.String(16), primary_key=True),
    sa.Column("project", sa.String(128), primary_key=True),
)
sessions = sa.Table(
    "mqgate_console_sessions",
    meta,
    sa.Column("id_hash", sa.String(64), primary_key=True),  # sha256 of the cookie value
    sa.Column("user_name", sa.String(128), nullable=False, index=True),
    sa.Column("csrf", sa.String(64), nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("seen_ms", sa.BigInteger, nullable=False),
)
# Failed sign-ins per key ("user:<name>" or "ip:<address>") in the current window.
throttle = sa.Table(
    "mqgate_console_throttle",
    meta,
    sa.Column("key", sa.String(200), primary_key=True),
    sa.Column("window_start_ms", sa.BigInteger, nullable=False),
    sa.Column("failures", sa.Integer, nullable=False),
)
audit = sa.Table(
    "mqgate_console_audit",
    meta,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("at_ms", sa.BigInteger, nullable=False, index=True),
    sa.Column("actor", sa.String(160), nullable=False, index=True),
    sa.Column("via", sa.String(16), nullable=False),  # console, api, cli
    sa.Column("action", sa.String(64), nullable=False, index=True),
    sa.Column("target", sa.String(300), nullable=False),
    sa.Column("project", sa.String(128), nullable=False, server_default=""),
    sa.Column("before", sa.Text, nullable=True),  # JSON
    sa.Column("after", sa.Text, nullable=True),  # JSON
)
applications = sa.Table(
    "mqgate_console_applications",
    meta,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("kind", sa.String(16), nullable=False),  # topic, producer, consumer
    sa.Column("name", sa.String(160), nullable=False),
    sa.Column("project", sa.String(128), nullable=False),
    sa.Column("settings", sa.Text, nullable=False),  # JSON
    sa.Column("applicant", sa.String(128), nullable=False, index=True),
    sa.Column("state", sa.String(16), nullable=False),  # pending, approved, rejected, failed
    sa.Column("decided_by", sa.String(128), nullable=True),
    sa.Column("comment", sa.Text, nullable=False, server_default=""),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("decided_ms", sa.BigInteger, nullable=True),
    # The new token, sealed, until the applicant has seen it once; then NULL.
    sa.Column("sealed_token", sa.Text, nullable=True),
)
project_settings = sa.Table(
    "mqgate_console_project_settings",
    meta,
    sa.Column("project", sa.String(128), primary_key=True),
    sa.Column("auto_approve", sa.Boolean, nullable=False),
)


def engine_for(engine_or_url: sa.Engine | str) -> sa.Engine:
    """The registry's engine, or one made like the registry makes it."""
    if isinstance(engine_or_url, sa.Engine):
        return engine_or_url
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if engine_or_url.startswith("sqlite"):
        kwargs["connect_args"] = {"timeout": 30, "check_same_thread": False}
    return sa.create_engine(engine_or_url, **kwargs)


def create_tables(engine: sa.Engine) -> None:
    create_all_shared(meta, engine)
