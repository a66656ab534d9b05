"""Where the queue fault timeline reads a project's queue state history from.

Two sources, both giving `ProjectWindow`s (the rows mqgate.queuestate.diagnosis reads):

- `HistorySource`: the history's database itself (`--queue-state-url`: the gateway's
  `<data_dir>/queue-state.sqlite`, or the registry's PostgreSQL when it has one), read with
  the gateway's own `QueueStateHistory`. Every row kind is there: queue, consumer and produce
  intervals, so every health rule can be judged.
- `GatewaySource`: the gateway's API, `GET /admin/projects/{name}/queues`, every page of it
  (`Client.project_queues` follows the answers' `next` cursor). It answers queue
  intervals only (max length, average length, dropped; no length limit), so only the
  `queue_full` rule by dropped messages can be judged from it: consumer faults and store
  faults need the consumer and produce intervals, which no route gives. `complete` is False
  and `missing` says so in the report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import sqlalchemy as sa

from mqgate.client import Client
from mqgate.errors import NotFound
from mqgate.queuestate.history import DEFAULT_TABLE_PREFIX, QueueStateHistory, history_url
from mqgate.queuestate.rows import ProjectWindow, QueueInterval

GATEWAY_MISSING = (
    "consumer intervals and produce intervals: GET /admin/projects/{name}/queues gives queue "
    "intervals only (and no length limit), so consumer faults and store faults cannot be judged "
    "from the gateway's API; pass --queue-state-url to read the history itself"
)


class QueueStateSource(Protocol):
    complete: bool  # every row kind the health rules read

    def describe(self) -> dict[str, Any]: ...

    def projects(self) -> list[str]: ...

    def window(self, project: str, since_ms: int | None, until_ms: int | None) -> ProjectWindow: ...


class HistorySource:
    """The queue state history's database, read directly (SQLite file or PostgreSQL URL)."""

    complete = True

    def __init__(self, target: str, table_prefix: str = DEFAULT_TABLE_PREFIX) -> None:
        url = history_url(target)
        if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
            raise NotFound(
                f"no queue state history at {url.removeprefix('sqlite:///')} (the gateway keeps it "
                "in <data_dir>/queue-state.sqlite, or in the registry's PostgreSQL)",
                field="--queue-state-url",
            )
        self.history = QueueStateHistory(url, table_prefix=table_prefix)
        self.shown_url = sa.make_url(url).render_as_string(hide_password=True)
        try:
            found = sa.inspect(self.history.engine).has_table(table_prefix + "queues")
        except sa.exc.SQLAlchemyError as exc:
            self.history.dispose()
            first = str(exc).strip().splitlines()[0]
            raise NotFound(
                f"cannot read the queue state history at {self.shown_url}: {first}", field="--queue-state-url"
            ) from exc
        if not found:
            self.history.dispose()
            raise NotFound(
                f"{self.shown_url} has no queue state tables (prefix {table_prefix})",
                field="--queue-state-url",
            )

    def describe(self) -> dict[str, Any]:
        return {"kind": "history", "url": self.shown_url, "tablePrefix": self.history.table_prefix}

    def projects(self) -> list[str]:
        return self.history.projects()

    def window(self, project: str, since_ms: int | None, until_ms: int | None) -> ProjectWindow:
        h = self.history
        return ProjectWindow(
            project,
            since_ms if since_ms is not None else 0,
            until_ms if until_ms is not None else 0,
            h.queue_history(project, since_ms=since_ms, until_ms=until_ms),
            h.consumer_history(project, since_ms=since_ms, until_ms=until_ms),
            h.produce_history(project, since_ms=since_ms, until_ms=until_ms),
        )

    def close(self) -> None:
        self.history.dispose()


class GatewaySource:
    """The gateway's `GET /admin/projects/{name}/queues` (queue intervals only)."""

    complete = False
    missing = GATEWAY_MISSING

    def __init__(self, client: Client) -> None:
        self.client = client

    def describe(self) -> dict[str, Any]:
        return {"kind": "gateway", "url": self.client.url, "missing": self.missing}

    def projects(self) -> list[str]:
        listed = self.client.projects()  # every page
        return sorted(str(p["name"]) for p in listed.get("projects", []))

    def window(self, project: str, since_ms: int | None, until_ms: int | None) -> ProjectWindow:
        answer = self.client.project_queues(project, since=since_ms, until=until_ms)  # every page
        return ProjectWindow(
            project,
            since_ms if since_ms is not None else 0,
            until_ms if until_ms is not None else 0,
            [_queue_row(project, r) for r in answer.get("intervals", [])],
            [],
            [],
        )

    def close(self) -> None:
        pass


def _queue_row(project: str, r: dict[str, Any]) -> QueueInterval:
    interval_ms = int(r["intervalMs"])
    avg = r.get("avgLength")
    # The answer has the average, not the area it came from: the area over the whole interval
    # gives the same average back (the rules read max length and drops only).
    return QueueInterval(
        project=project,
        topic=str(r["topic"]),
        queue=int(r["queue"]),
        start_ms=int(r["startMs"]),
        interval_ms=interval_ms,
        max_length=r.get("maxLength"),
        length_area=round(float(avg) * interval_ms) if avg is not None else 0,
        covered_ms=interval_ms if avg is not None else 0,
        samples=0,
        length_limit=None,
        dropped=int(r.get("dropped", 0)),
    )
