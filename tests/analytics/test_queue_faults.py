"""Queue fault vs consumer fault over time: the 8-hour load's queue state history (known
faults, mqgate.analytics.queuestate_load) written through the gateway's history module to
SQLite and PostgreSQL, and read back by the report; each fault is found in its intervals."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mqgate.analytics import queuefaults
from mqgate.analytics.generator import LoadSpec
from mqgate.analytics.plots import plots
from mqgate.analytics.queuestate_load import known_faults, queue_state_rows
from mqgate.analytics.queuestate_source import HistorySource
from mqgate.analytics.render import write_report
from mqgate.errors import NotFound
from mqgate.queuestate.diagnosis import Thresholds
from mqgate.queuestate.history import QueueStateHistory
from tests.analytics.conftest import Loaded
from tests.conftest import require_service

pytestmark = pytest.mark.slow

SPEC = LoadSpec()
MIN = 60_000
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def minute(ms: int) -> int:
    return (ms - SPEC.start_ms) // MIN


@pytest.fixture(params=["sqlite", "postgresql"])
def history(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The load's rows in a history: (its URL, its table prefix)."""
    prefix = "mqgate_qstate_"
    if request.param == "sqlite":
        url = str(tmp_path / "queue-state.sqlite")
    else:
        require_service("127.0.0.1", 5432, "PostgreSQL")
        url, prefix = PG_URL, "qf" + secrets.token_hex(4) + "_"
    h = QueueStateHistory(url, table_prefix=prefix)
    h.create_schema()
    h.write(queue_state_rows(SPEC))
    yield url, prefix
    if request.param == "postgresql":
        h.drop_schema()
    h.dispose()


def judged(url: str, prefix: str, project: str | None, from_ms: int, to_ms: int) -> dict[str, Any]:
    source = HistorySource(url, prefix)
    try:
        return queuefaults.section(source, project, from_ms, to_ms, Thresholds())
    finally:
        source.close()


def test_each_known_fault_is_found_in_its_intervals_and_nowhere_else(history: tuple[str, str]) -> None:
    section = judged(*history, None, SPEC.start_ms, SPEC.end_ms)
    assert section["complete"] and section["source"]["kind"] == "history"
    assert sorted(section["projects"]) == ["pay", "shop"]
    found = sorted(
        (
            p,
            r["rule"],
            r["side"],
            r["topic"],
            r["queue"],
            r["consumer"],
            minute(r["fromMs"]),
            minute(r["toMs"]),
        )
        for p, tl in section["projects"].items()
        for r in tl["runs"]
    )
    expected = sorted(
        (k.project, k.rule, k.side, k.topic, k.queue, k.consumer, k.from_minute, k.to_minute)
        for k in known_faults()
    )
    assert found == expected

    pay = section["projects"]["pay"]
    states = {minute(i["t"]): i["state"] for i in pay["intervals"]}
    assert len(states) == SPEC.minutes and pay["intervalMs"] == MIN
    want = {m: "healthy" for m in range(SPEC.minutes)}
    want |= dict.fromkeys(range(120, 210), "queue_fault")
    want |= dict.fromkeys(range(420, 440), "consumer_fault")
    want |= dict.fromkeys(range(440, 450), "queue_and_consumer_fault")
    assert states == want
    assert pay["totals"] == {"intervals": 480, "healthy": 360, "queueFault": 90, "consumerFault": 20,
                             "queueAndConsumerFault": 10, "noData": 0}  # fmt: skip
    # The health answer keeps a store fault for its 5-minute window; the timeline does not.
    health = {minute(i["t"]): i["health"] for i in pay["intervals"]}
    assert [health[m] for m in range(208, 216)] == ["queue_fault"] * 6 + ["healthy"] * 2
    # Consumer down is detected after 5 silent minutes, but marked from the interval after the last pull.
    assert health[423] == "healthy" and health[424] == "consumer_fault" and states[420] == "consumer_fault"
    # Client errors (bad_request at minutes 0, 37, ...) are not store faults.
    assert states[0] == states[37] == "healthy"

    lanes = {lane["label"]: lane for lane in pay["lanes"]}
    assert sorted(lanes) == ["ledger on payments", "queues of payments"]
    assert lanes["ledger on payments"]["faultIntervals"] == 30
    assert lanes["queues of payments"]["faultIntervals"] == 100
    shop = section["projects"]["shop"]
    assert shop["totals"]["queueFault"] == 90 + 10 + 5 and shop["totals"]["consumerFault"] == 0


def test_a_window_part_way_through_a_fault_is_judged_with_the_rows_before_it(tmp_path: Path) -> None:
    url = str(tmp_path / "qs.sqlite")
    h = QueueStateHistory(url)
    h.create_schema()
    h.write(queue_state_rows(SPEC))
    h.dispose()
    from_ms, to_ms = SPEC.start_ms + 425 * MIN + 5_000, SPEC.start_ms + 445 * MIN  # not on a boundary
    tl = judged(url, "mqgate_qstate_", "pay", from_ms, to_ms)["projects"]["pay"]
    assert [minute(i["t"]) for i in tl["intervals"]] == list(range(426, 445))
    # Down since minute 420, found from the first interval of the window on.
    assert {i["state"] for i in tl["intervals"] if minute(i["t"]) < 440} == {"consumer_fault"}
    assert [(r["rule"], minute(r["fromMs"]), minute(r["toMs"])) for r in tl["runs"]] == [
        ("consumer_down", 426, 445),
        ("queue_full", 440, 445),
    ]
    nothing = judged(url, "mqgate_qstate_", "nosuch", from_ms, to_ms)
    assert nothing["projects"] == {}
    assert nothing["notes"] == ["No queue state recorded for project nosuch in this window."]


def test_a_missing_history_is_named(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match=r"no queue state history at .*nothing\.sqlite"):
        HistorySource(str(tmp_path / "nothing.sqlite"))
    (tmp_path / "empty.sqlite").write_bytes(b"")
    with pytest.raises(NotFound, match=r"has no queue state tables \(prefix mqgate_qstate_\)"):
        HistorySource(str(tmp_path / "empty.sqlite"))


def test_the_report_shows_the_timeline_and_json_has_every_interval(loaded: Loaded, tmp_path: Path) -> None:
    url = str(tmp_path / "qs.sqlite")
    h = QueueStateHistory(url)
    h.create_schema()
    h.write(queue_state_rows(SPEC))
    h.dispose()
    report = {**loaded.report, "queueFaults": judged(url, "mqgate_qstate_", None, SPEC.start_ms, SPEC.end_ms)}
    svgs = plots(report)
    assert {"queueFaults:pay", "queueFaults:shop"} <= set(svgs)
    html, js = write_report(report, svgs, tmp_path / "report", None)
    page = html.read_text()
    assert "Queue fault vs consumer fault over time" in page
    assert page.count("<svg") == 5 + 2
    assert "consumer ledger on payments: no pull for" in page  # the down run's first finding
    data = json.loads(js.read_text())["queueFaults"]
    assert len(data["projects"]["pay"]["intervals"]) == 480
    assert data["thresholds"]["silent_after_ms"] == 300_000
