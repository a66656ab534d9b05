"""The pipeline's config and parsing, tested directly (no servers), and the CLI's config errors."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from mqgate.pipeline.config import EventType, PipelineConfigError, load_config, parse_config
from mqgate.pipeline.parsing import (
    PROP_ATTEMPTS,
    PROP_EVENT_ID,
    PROP_ORIGIN,
    SourceMessage,
    encode_internal,
    parse_internal,
    parse_message,
)

ROOT = Path(__file__).resolve().parents[2]
ENV = {"MQGATE_ADMIN_TOKEN": "mqa_from_env"}


def minimal(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "job": {"name": "vid", "gateway": "http://127.0.0.1:8080"},
        "events": [{"type": "like", "topic": "likes", "format": "json", "key": "video.id", "table": "likes"}],
        "sink": {"url": "postgresql+psycopg://postgres@127.0.0.1/db"},
    }
    for dotted, value in overrides.items():
        section, _, key = dotted.partition("__")
        if section == "event":
            raw["events"][0][key] = value
        else:
            raw.setdefault(section, {})[key] = value
    return raw


def config_error(raw: dict[str, Any], env: dict[str, str] | None = None) -> PipelineConfigError:
    with pytest.raises(PipelineConfigError) as info:
        parse_config(raw, ENV if env is None else env)
    return info.value


class TestConfig:
    def test_defaults(self) -> None:
        cfg = parse_config(minimal(), ENV)
        assert cfg.job.admin_token == "mqa_from_env"
        assert cfg.job.partitions == 16 and cfg.job.mode == "concurrent"
        assert cfg.hot_keys.topic == "vid-hot" and cfg.retry.topic == "vid-retry"
        assert cfg.retry.delay_s == 60.0 and cfg.retry.max_attempts == 5
        assert cfg.aggregate.count == 100 and cfg.aggregate.age_s == 300.0
        assert cfg.sink.url == "postgresql://postgres@127.0.0.1/db"  # SQLAlchemy form accepted
        assert cfg.hot_share == pytest.approx(0.1 / 16)
        assert cfg.consumer("like") == "spark-vid-like"

    def test_the_shipped_example_loads(self) -> None:
        cfg = load_config(ROOT / "examples/pipeline/video-events.toml", env=ENV)
        assert [e.type for e in cfg.events] == ["like", "comment"]
        assert cfg.event_type("comment").format == "batch"

    @pytest.mark.parametrize(
        ("overrides", "field"),
        [
            ({"job__partitions": 0}, "job.partitions"),
            ({"job__partitions": "16"}, "job.partitions"),
            ({"job__partitions": True}, "job.partitions"),
            ({"job__mode": "parallel"}, "job.mode"),
            ({"job__name": "a b"}, "job.name"),
            ({"job__gateway": "ftp://x"}, "job.gateway"),
            ({"job__partitons": 4}, "job.partitons"),
            ({"job__starting_offsets": "first"}, "job.starting_offsets"),
            ({"event__format": "xml"}, "events[0].format"),
            ({"event__table": "Likes; drop"}, "events[0].table"),
            ({"event__key": "a..b"}, "events[0].key"),
            ({"event__fields": {"user": 3}}, "events[0].fields.user"),
            ({"event__fields": {"payload": "x"}}, "events[0].fields.payload"),
            ({"event__types": {"user": "bigint"}}, "events[0].types.user"),
            ({"hot_keys__min_share": 1.5}, "hot_keys.min_share"),
            ({"hot_keys__topic": "likes"}, "hot_keys.topic"),
            ({"retry__max_attempts": 0}, "retry.max_attempts"),
            ({"retry__topic": "vid-hot"}, "retry.topic"),
            ({"sink__url": "mysql://x"}, "sink.url"),
            ({"sink__fail_keys": [1]}, "sink.fail_keys"),
            ({"sink__max_connections": 0}, "sink.max_connections"),
            ({"aggregate__count": 0}, "aggregate.count"),
        ],
    )
    def test_errors_name_the_key(self, overrides: dict[str, Any], field: str) -> None:
        err = config_error(minimal(**overrides))
        assert err.field == field, err.message
        assert field in err.message

    def test_string_format_takes_no_key_path(self) -> None:
        raw = minimal(event__format="string")
        assert config_error(raw).field == "events[0].key"
        del raw["events"][0]["key"]
        assert parse_config(raw, ENV).events[0].key is None

    def test_admin_token_is_required(self) -> None:
        assert config_error(minimal(), env={}).field == "job.admin_token"
        assert parse_config(minimal(job__admin_token="t"), {}).job.admin_token == "t"

    def test_unknown_section_and_duplicate_types(self) -> None:
        assert config_error({**minimal(), "sinks": {}}).field == "sinks"
        raw = minimal()
        raw["events"].append({**raw["events"][0], "topic": "other", "table": "other"})
        assert config_error(raw).field == "events[1].type"

    def test_no_events(self) -> None:
        raw = minimal()
        raw["events"] = []
        assert config_error(raw).field == "events"

    def test_bad_toml_file(self, tmp_path: Path) -> None:
        path = tmp_path / "p.toml"
        path.write_text("[job\nname=1")
        with pytest.raises(PipelineConfigError, match="not valid TOML"):
            load_config(path, env=ENV)


JSON_TYPE = EventType("like", "likes", "json", "video.id", "likes", {"user": "user.id", "tags": "tags"})
BATCH_TYPE = EventType("comment", "comments", "batch", "video", "comments", {"text": "text"})
STRING_TYPE = EventType("view", "views", "string", None, "views")
BYTES_TYPE = EventType("blob", "blobs", "bytes", None, "blobs")


def message(body: str, keys: tuple[str, ...] = (), **props: str) -> SourceMessage:
    return SourceMessage("m1", body, "likes", 3, 41, 1_700_000_000_000, keys, props)


class TestParsing:
    def test_json(self) -> None:
        body = json.dumps({"video": {"id": 42}, "user": {"id": "u1"}, "tags": ["a", "b"]})
        events, failures = parse_message(JSON_TYPE, message(body))
        assert failures == []
        (e,) = events
        assert (e.event_id, e.type, e.key, e.payload) == ("m1", "like", "42", body)
        assert e.fields == {"user": "u1", "tags": '["a","b"]'}
        assert (e.source, e.origin, e.attempts, e.event_ms) == ("likes", "likes", 1, 1_700_000_000_000)

    def test_json_missing_field_is_null_but_missing_key_fails(self) -> None:
        (e,), _ = parse_message(JSON_TYPE, message('{"video": {"id": "v"}}'))
        assert e.fields == {"user": None, "tags": None}
        _, (f,) = parse_message(JSON_TYPE, message('{"video": {}}'))
        assert f.event_id == "m1" and "no key at video.id" in f.error

    @pytest.mark.parametrize(
        ("body", "error"),
        [
            ("not json", "not JSON"),
            ("[1]", "expected a JSON object"),
            ('{"video": {"id": true}}', "not a string or integer"),
            ('{"video": {"id": ""}}', "empty"),
        ],
    )
    def test_json_failures(self, body: str, error: str) -> None:
        events, (f,) = parse_message(JSON_TYPE, message(body))
        assert events == [] and error in f.error and f.payload == body

    def test_batch_items_get_their_own_ids_and_failures(self) -> None:
        body = json.dumps([{"video": "a", "text": "hi"}, {"text": "no key"}, {"video": "b"}])
        events, failures = parse_message(BATCH_TYPE, message(body))
        assert [(e.event_id, e.key, e.fields["text"]) for e in events] == [
            ("m1#0", "a", "hi"),
            ("m1#2", "b", None),
        ]
        assert [f.event_id for f in failures] == ["m1#1"]
        assert json.loads(failures[0].payload) == {"text": "no key"}

    def test_batch_must_be_an_array(self) -> None:
        events, (f,) = parse_message(BATCH_TYPE, message('{"video": "a"}'))
        assert events == [] and "JSON array" in f.error
        assert parse_message(BATCH_TYPE, message("[]")) == ([], [])

    def test_string_key_from_message_keys(self) -> None:
        (e,), _ = parse_message(STRING_TYPE, message("hello", keys=("v7", "other")))
        assert (e.key, e.payload, e.fields) == ("v7", "hello", {})
        _, (f,) = parse_message(STRING_TYPE, message("hello"))
        assert "no keys" in f.error

    def test_bytes_are_base64(self) -> None:
        raw = base64.b64encode(b"\x00\xffbin").decode()
        (e,), _ = parse_message(BYTES_TYPE, message(raw, keys=("k",), encoding="base64"))
        assert base64.b64decode(e.payload) == b"\x00\xffbin"
        _, (f,) = parse_message(BYTES_TYPE, message("not base64!", keys=("k",)))
        assert "base64" in f.error

    def test_internal_round_trip_keeps_the_event_id(self) -> None:
        body = json.dumps([{"video": "a", "text": "x"}, {"video": "b", "text": "y"}])
        _, second = parse_message(BATCH_TYPE, message(body))[0]
        item = encode_internal(second, attempts=2, error="boom")
        assert item["properties"][PROP_EVENT_ID] == "m1#1" and item["properties"][PROP_ATTEMPTS] == "2"
        stored = SourceMessage(
            "other-id", item["message"], "vid-retry", 0, 5, 9, item["keys"], item["properties"]
        )
        (again,), _ = parse_internal(stored, {"comment": BATCH_TYPE}, next_attempt=True)
        assert (again.event_id, again.key, again.fields, again.payload) == (
            "m1#1",
            "b",
            {"text": "y"},
            second.payload,
        )
        assert (again.attempts, again.source, again.origin) == (3, "vid-retry", "likes")
        (hot,), _ = parse_internal(stored, {"comment": BATCH_TYPE}, next_attempt=False)
        assert hot.attempts == 2

    def test_internal_unknown_type_fails(self) -> None:
        item = encode_internal(parse_message(JSON_TYPE, message('{"video": {"id": 1}}'))[0][0])
        stored = SourceMessage("x", item["message"], "vid-hot", 0, 0, 0, (), {PROP_ORIGIN: "likes"})
        events, (f,) = parse_internal(stored, {"comment": BATCH_TYPE}, next_attempt=False)
        assert events == [] and "unknown event type" in f.error and f.event_id == "x"


def test_cli_reports_config_errors_by_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mqgate.cli import main

    path = tmp_path / "bad.toml"
    path.write_text('[job]\nname = "x"\ngateway = "http://127.0.0.1:1"\nadmin_token = "t"\npartitions = 0\n')
    assert main(["pipeline", "run", str(path)]) == 2
    assert "job.partitions must be between 1 and 1024" in capsys.readouterr().err
