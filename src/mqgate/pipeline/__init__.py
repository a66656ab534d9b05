"""The event pipeline on Spark (SPEC E2-E8, D2): `mqgate pipeline run <config.toml>`.

Key-hash parallelism over N worker queues, hot-key isolation through a hot topic, retry
through delayed messages, a dead-letter table, aggregation mode, and offsets committed only
after the PostgreSQL sink succeeded. See docs/PIPELINE.md.
"""
