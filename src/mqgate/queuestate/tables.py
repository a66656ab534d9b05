"""The queue state history's tables, named under a prefix (see history.py)."""

from __future__ import annotations

import sqlalchemy as sa


def make_tables(prefix: str) -> tuple[sa.MetaData, sa.Table, sa.Table, sa.Table, sa.Table]:
    meta = sa.MetaData()
    queues = sa.Table(
        prefix + "queues",
        meta,
        sa.Column("project", sa.String(128), primary_key=True),
        sa.Column("topic", sa.String(160), primary_key=True),
        sa.Column("queue", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("start_ms", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("interval_ms", sa.BigInteger, nullable=False),
        sa.Column("max_length", sa.BigInteger, nullable=True),
        sa.Column("length_area", sa.BigInteger, nullable=False),
        sa.Column("covered_ms", sa.BigInteger, nullable=False),
        sa.Column("samples", sa.BigInteger, nullable=False),
        sa.Column("length_limit", sa.BigInteger, nullable=True),
        sa.Column("dropped", sa.BigInteger, nullable=False),
        # A steady run of this many intervals (queuestate/rows.py): added to older tables by
        # QueueStateHistory.create_schema.
        sa.Column("intervals", sa.BigInteger, nullable=False, server_default="1"),
        sa.Index(prefix + "queues_time", "project", "start_ms"),
        sa.Index(prefix + "queues_age", "start_ms"),
    )
    consumers = sa.Table(
        prefix + "consumers",
        meta,
        sa.Column("project", sa.String(128), primary_key=True),
        sa.Column("consumer", sa.String(128), primary_key=True),
        sa.Column("topic", sa.String(160), primary_key=True),
        sa.Column("queue", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("start_ms", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("interval_ms", sa.BigInteger, nullable=False),
        sa.Column("max_backlog", sa.BigInteger, nullable=True),
        sa.Column("backlog_area", sa.BigInteger, nullable=False),
        sa.Column("covered_ms", sa.BigInteger, nullable=False),
        sa.Column("samples", sa.BigInteger, nullable=False),
        sa.Column("pulls", sa.BigInteger, nullable=False),
        sa.Column("delivered", sa.BigInteger, nullable=False),
        sa.Column("acks", sa.BigInteger, nullable=False),
        sa.Column("acked", sa.BigInteger, nullable=False),
        sa.Column("last_pull_ms", sa.BigInteger, nullable=True),
        sa.Column("intervals", sa.BigInteger, nullable=False, server_default="1"),
        sa.Index(prefix + "consumers_time", "project", "start_ms"),
        sa.Index(prefix + "consumers_age", "start_ms"),
    )
    produce = sa.Table(
        prefix + "produce",
        meta,
        sa.Column("project", sa.String(128), primary_key=True),
        sa.Column("topic", sa.String(160), primary_key=True),
        sa.Column("start_ms", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("interval_ms", sa.BigInteger, nullable=False),
        sa.Column("produced", sa.BigInteger, nullable=False),
        sa.Index(prefix + "produce_time", "project", "start_ms"),
        sa.Index(prefix + "produce_age", "start_ms"),
    )
    errors = sa.Table(
        prefix + "produce_errors",
        meta,
        sa.Column("project", sa.String(128), primary_key=True),
        sa.Column("topic", sa.String(160), primary_key=True),
        sa.Column("start_ms", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("error_type", sa.String(64), primary_key=True),
        sa.Column("count", sa.BigInteger, nullable=False),
        sa.Index(prefix + "produce_errors_age", "start_ms"),
    )
    return meta, queues, consumers, produce, errors
