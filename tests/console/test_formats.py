"""How the console writes figures (console/formats.py) and the settings page's rows
(console/settings_view.py): pure functions, no server."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqgate.console.formats import count, duration, evidence_items, millis, number, offsets
from mqgate.console.settings_view import setting_rows, shown
from mqgate.settings import Settings, load_settings


@pytest.mark.parametrize(
    ("n", "word", "text"),
    [(1, "copy", "1 copy"), (2, "copy", "2 copies"), (0, "message", "0 messages"),
     (12000, "message", "12,000 messages"), (1, "record", "1 record"), (3, "process", "3 processes")],
)  # fmt: skip
def test_counts_agree_with_their_number(n: int, word: str, text: str) -> None:
    assert count(n, word) == text


def test_numbers_carry_no_float_noise() -> None:
    assert millis(4.999999999881766) == "5.0 ms"
    assert millis(0.4219) == "0.42 ms"
    assert millis(1250.2) == "1,250 ms"
    assert millis(0.9999) == "1.0 ms" and millis(99.97) == "100 ms"
    assert number(2.50) == "2.5" and number(3.0) == "3" and number(1234567) == "1,234,567"
    assert number(None) == "—"


def test_offsets_name_the_last_record_not_the_end() -> None:
    assert offsets(0, 10) == "offsets 0–9 (10 records)"  # was "offsets 0–10" for 10 records
    assert offsets(7, 8) == "offset 7 (1 record)"
    assert offsets(5, 5) == "no records"


def test_durations_in_words() -> None:
    assert duration(850) == "850 ms"
    assert duration(12_000) == "12 s"
    assert duration(250_000) == "4 min 10 s"
    assert duration(3_600_000 * 3 + 300_000) == "3 h 5 min"


def test_evidence_is_typed_not_a_python_dict() -> None:
    items = dict(
        evidence_items(
            {
                "backlog": [3.0, 5.0, 8.25],
                "backlog_by_queue": {"0": 12.0, "1": 3.5},
                "last_pull_ms": None,
                "silent_ms": 250_000,
                "error_ratio": 0.0312,
                "growth_per_s": 1.5,
                "store_errors": {},
                "max_length": 1200,
            }
        )
    )
    assert items == {
        "backlog": "3 → 5 → 8.25",
        "backlog by queue": "queue 0: 12 · queue 1: 3.5",
        "last pull": "never",
        "silent for": "4 min 10 s",
        "failed": "3.1 %",
        "growth": "1.5/s",
        "store errors": "none",
        "max length": "1,200",
    }
    assert not any("{" in text or "None" in text for text in items.values())


def test_settings_rows_name_their_source_and_hide_secrets(tmp_path: Path) -> None:
    config = tmp_path / "mqgate.toml"
    config.write_text('default_queues = 6\nmetrics_token = "m-secret"\n')
    s = load_settings(
        config,
        env={"MQGATE_STORE": "redis://user:hunter2@10.0.0.5:6379/0", "MQGATE_ADMIN_TOKEN": "a-secret"},
        port=9001,
    )
    rows = {r.name: r for r in setting_rows(s)}
    assert rows["default_queues"].source == f"file {config}" and rows["default_queues"].value == "6"
    assert rows["default_queues"].default == "8"
    assert rows["store"].source == "env MQGATE_STORE"
    assert rows["store"].value == "redis://user:***@10.0.0.5:6379/0"
    assert rows["port"].source == "command line"
    assert rows["host"].source == "default"
    for name in ("admin_token", "metrics_token"):
        assert rows[name].value == "(set, hidden)"
    assert not any(secret in repr(list(rows.values())) for secret in ("hunter2", "a-secret", "m-secret"))
    assert "sources" not in rows  # bookkeeping, not a setting
    assert rows["fsync"].help.startswith('"always": a produce or ack is answered after fsync')


def test_secrets_in_urls_and_lists_of_urls_stay_hidden() -> None:
    assert shown("registry", "postgresql+psycopg://mq@h/db?password=s3cret&sslmode=require") == (
        "postgresql+psycopg://mq@h/db?password=***&sslmode=require"
    )
    assert shown("store", "redis://h:6379/0?password=s3cret") == "redis://h:6379/0?password=***"
    assert shown("alert_webhook_url", "https://hooks.slack.com/services/T0/B0/XyZsecret") == "(set, hidden)"
    clusters = "main/a=redis://:pw1@h1:6379/0 main/b=redis://u:pw2@h2:6379/0"
    assert (
        shown("failover_clusters", clusters) == "main/a=redis://:***@h1:6379/0 main/b=redis://u:***@h2:6379/0"
    )


def test_a_setting_changed_in_code_says_so() -> None:
    s = Settings(default_queues=3)
    assert {r.name: r.source for r in setting_rows(s)}["default_queues"] == "set by the program"


def test_unknown_sources_stay_unknown_settings() -> None:
    with pytest.raises(Exception, match="unknown settings: sources"):
        load_settings(env={}, sources={"x": "y"})
    assert shown("registry", "") == "(empty)"


def test_elapsed_times_and_offset_ranges() -> None:
    from mqgate.console.formats import elapsed, offset_range

    assert [elapsed(x) for x in (12, 999.6, 3125, 6135, 250_000)] == ["12 ms", "1,000 ms", "3.1 s", "6.1 s",
                                                                       "4 min 10 s"]  # fmt: skip
    assert [offset_range(0, 69), offset_range(5, 6), offset_range(3, 3)] == [
        "offsets 0–68",
        "offset 5",
        "no offsets",
    ]


def test_a_latency_below_a_hundredth_of_a_millisecond_is_not_zero() -> None:
    assert [millis(0.004), millis(0.0), millis(0.006)] == ["<0.01 ms", "<0.01 ms", "0.01 ms"]
