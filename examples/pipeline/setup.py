#!/usr/bin/env python3
"""Everything the pipeline example needs before `mqgate pipeline run`: its PostgreSQL database,
its event topics and sample events.

    python examples/pipeline/setup.py examples/pipeline/video-events.toml [--likes N] [--comments N]

Reads the gateway, the admin token (or MQGATE_ADMIN_TOKEN), the sink database and the event
topics from the pipeline's TOML file, then

1. creates the sink database (`sink.url`'s dbname) if it does not exist; the pipeline creates
   its tables in it when it starts;
2. creates each event type's topic (kept if it exists) and a producer `<topic>-sample` for it;
3. produces sample events: likes as one JSON object per message, comments as a JSON array of
   1-4 comments per message, on 200 videos whose popularity is skewed (a few are hot).

Runs again without harm: the database and topics are kept, and more sample events are added.
Needs psycopg (`mqgate[postgres]`; the pipeline itself needs `mqgate[spark,postgres]`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import time
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from mqgate.client import Client
from mqgate.errors import AlreadyExists, MqgateError
from mqgate.pipeline.config import EventType, load_config

VIDEOS = 200
SEED = 7


def create_database(url: str) -> str:
    """Create the database `url` names, connecting to the server's `postgres` database."""
    info = conninfo_to_dict(url)
    name = str(info.get("dbname") or "")
    if not name:
        raise SystemExit(f"sink.url {url} names no database")
    with psycopg.connect(make_conninfo(url, dbname="postgres"), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            return f"database {name} created"
    return f"database {name} exists"


def video(rng: random.Random) -> str:
    # Zipf-like popularity: video 0 gets the most events, so hot-key isolation has work to do.
    return f"v{min(int(rng.paretovariate(1.2)) - 1, VIDEOS - 1)}"


def like(rng: random.Random, now_ms: int) -> dict[str, Any]:
    return {
        "video_id": video(rng),
        "user_id": f"u{rng.randrange(10_000)}",
        "ts": now_ms - rng.randrange(86_400_000),
    }


def comments(rng: random.Random) -> list[dict[str, Any]]:
    words = ("nice", "great", "first", "why", "again", "love it", "meh")
    return [
        {"video_id": video(rng), "user_id": f"u{rng.randrange(10_000)}", "text": rng.choice(words)}
        for _ in range(rng.randint(1, 4))
    ]


def sample_messages(et: EventType, count: int, rng: random.Random) -> list[dict[str, Any]]:
    now_ms = int(time.time() * 1000)
    if et.format == "batch":
        bodies = [json.dumps(comments(rng)) for _ in range(count)]
    else:
        bodies = [json.dumps(like(rng, now_ms)) for _ in range(count)]
    return [{"message": body} for body in bodies]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="the pipeline's TOML file, e.g. examples/pipeline/video-events.toml")
    parser.add_argument("--likes", type=int, default=2000, help="messages for each json event type")
    parser.add_argument("--comments", type=int, default=500, help="messages for each batch event type")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    print(create_database(config.sink.url))
    rng = random.Random(SEED)
    with Client(config.job.gateway, config.job.admin_token, timeout_s=30.0) as client:
        for et in config.events:
            try:
                client.create_topic(et.topic)
                print(f"topic {et.topic} created")
            except AlreadyExists:
                print(f"topic {et.topic} exists")
            producer = f"{et.topic}-sample"
            # Kept if it exists: the admin token produces for any registered producer.
            with contextlib.suppress(AlreadyExists):
                client.register_producer(producer, et.topic)
            count = args.comments if et.format == "batch" else args.likes
            produced = client.produce(producer, sample_messages(et, count, rng))
            print(f"{produced} sample {et.type} messages produced to {et.topic}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (MqgateError, psycopg.Error) as exc:
        print(f"setup failed: {exc}", file=sys.stderr)
        sys.exit(1)
