"""The gateway calls the pipeline makes itself: idempotent setup, hot/retry produce, progress.

Reads and offset commits go through mqgate.spark. Every call goes through mqgate.client,
retried on transient failures (the gateway restarting, 503) for up to RETRY_FOR_S: a produce
repeated after an unanswered attempt may store a message twice, which the sink's ledger absorbs.
"""

from __future__ import annotations

import contextlib
from typing import Final

from mqgate.client import Client
from mqgate.errors import AlreadyExists

TIMEOUT_S: Final = 30.0
RETRY_FOR_S: Final = 30.0


class GatewayClient(Client):
    """The job's view of its gateway, with the admin token."""

    def __init__(self, url: str, admin_token: str) -> None:
        super().__init__(url, admin_token, timeout_s=TIMEOUT_S, retry_for_s=RETRY_FOR_S)

    # --- setup (SPEC: the job registers what it needs; what exists already is left as it is)

    def ensure_topic(self, name: str, queues: int) -> None:
        with contextlib.suppress(AlreadyExists):
            self.create_topic(name, queues=queues)

    def ensure_producer(self, name: str, topic: str) -> None:
        with contextlib.suppress(AlreadyExists):
            self.register_producer(name, topic)

    def ensure_consumer(self, name: str, topic: str) -> None:
        with contextlib.suppress(AlreadyExists):
            self.register_consumer(name, topic, mode="cluster")

    def topic_exists(self, name: str) -> bool:
        return any(t.get("name") == name for t in self.topics().get("topics", []))

    def lag(self, consumer: str) -> int:
        return int(self.progress(consumer)["lag"])
