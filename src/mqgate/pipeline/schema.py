"""The pipeline's PostgreSQL tables, created idempotently by the driver at start.

Shared tables are keyed by job, so several pipelines can use one database. Each event type
has its own target table: a row per event in concurrent mode, a counter per key in
aggregation mode.
"""

from __future__ import annotations

from typing import Any, Final

import psycopg
from psycopg import sql

from mqgate.pipeline.config import EventType, PipelineConfig

LEDGER: Final = "mqgate_pipeline_ledger"
DEAD_LETTERS: Final = "mqgate_pipeline_dead_letters"
RETRIES: Final = "mqgate_pipeline_retries"
HOT_KEYS: Final = "mqgate_pipeline_hot_keys"
PENDING: Final = "mqgate_pipeline_pending"
FLUSHES: Final = "mqgate_pipeline_flushes"
FAULT_PROBE: Final = "mqgate_pipeline_fault_probe"

SHARED_DDL: Final = (
    # One row per applied event: the guard that makes every write exactly-once.
    f"""CREATE TABLE IF NOT EXISTS {LEDGER} (
        job text NOT NULL, event_id text NOT NULL, type text NOT NULL, key text NOT NULL,
        attempts integer NOT NULL, source text NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (job, event_id))""",
    f"""CREATE TABLE IF NOT EXISTS {DEAD_LETTERS} (
        job text NOT NULL, event_id text NOT NULL, type text NOT NULL, payload text NOT NULL,
        error text NOT NULL, attempts integer NOT NULL, source text NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (job, event_id))""",
    # Events sent to the retry topic and not finished yet: an --available-now run waits
    # for these, since a delayed message is invisible in the topic until it is due.
    f"""CREATE TABLE IF NOT EXISTS {RETRIES} (
        job text NOT NULL, event_id text NOT NULL, type text NOT NULL, attempts integer NOT NULL,
        due_ms bigint NOT NULL, error text NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (job, event_id))""",
    f"""CREATE TABLE IF NOT EXISTS {HOT_KEYS} (
        job text NOT NULL, type text NOT NULL, batch_id bigint NOT NULL, key text NOT NULL,
        events integer NOT NULL, moved integer NOT NULL, reason text NOT NULL,
        detected_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (job, type, batch_id, key))""",
    f"""CREATE TABLE IF NOT EXISTS {PENDING} (
        job text NOT NULL, type text NOT NULL, key text NOT NULL, count bigint NOT NULL,
        first_ms bigint NOT NULL, last_ms bigint NOT NULL,
        PRIMARY KEY (job, type, key))""",
    f"""CREATE TABLE IF NOT EXISTS {FLUSHES} (
        id bigserial PRIMARY KEY, job text NOT NULL, type text NOT NULL, key text NOT NULL,
        count bigint NOT NULL, reason text NOT NULL,
        flushed_at timestamptz NOT NULL DEFAULT now())""",
)
# Failure injection (a testing knob) writes here: the CHECK makes it a real constraint
# violation raised by PostgreSQL, so isolation and retry are exercised for real. Created only
# for a config that injects failures: a user's database gets no table of the tests.
FAULT_PROBE_DDL: Final = f"""CREATE TABLE IF NOT EXISTS {FAULT_PROBE} (
    event_id text NOT NULL, ok boolean NOT NULL CHECK (ok))"""


def injects_failures(config: PipelineConfig) -> bool:
    s = config.sink
    return bool(s.fail_keys or s.fail_always_keys or s.fail_first_attempt_share)


def event_table_ddl(et: EventType, mode: str) -> list[sql.Composed]:
    table = sql.Identifier(et.table)
    if mode == "aggregate":
        return [
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (key text PRIMARY KEY, count bigint NOT NULL, "
                "updated_at timestamptz NOT NULL DEFAULT now())"
            ).format(table)
        ]
    columns = [
        sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(et.field_types.get(c, "text"))) for c in et.fields
    ]
    return [
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (event_id text PRIMARY KEY, key text NOT NULL, {}"
            "payload text NOT NULL, event_ms bigint NOT NULL, source text NOT NULL, "
            "attempts integer NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        ).format(table, sql.SQL("").join(sql.SQL("{}, ").format(c) for c in columns)),
        sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (key)").format(sql.Identifier(f"{et.table}_key"), table),
    ]


def create_tables(conn: psycopg.Connection[Any], config: PipelineConfig) -> None:
    # Two pipelines starting at once would race on CREATE TABLE IF NOT EXISTS (it is not
    # atomic against itself); an advisory lock serialises them.
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('mqgate_pipeline_schema'))")
        for statement in SHARED_DDL:
            conn.execute(statement)
        if injects_failures(config):
            conn.execute(FAULT_PROBE_DDL)
        for et in config.events:
            for composed in event_table_ddl(et, config.job.mode):
                conn.execute(composed)
