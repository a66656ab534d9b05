"""The pipeline's configuration: one TOML file, validated into frozen msgspec Structs.

Every error names the offending key (`events[1].format`, `sink.batch_rows`), so a typo is
reported as the setting it is in, not as a failure somewhere inside Spark.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, TypeVar

import msgspec

from mqgate.errors import BadRequest
from mqgate.names import validate_name

FORMATS: Final = ("json", "string", "bytes", "batch")
MODES: Final = ("concurrent", "aggregate")
# Columns of a concurrent-mode table may be typed; values arrive as text and are cast by
# PostgreSQL, so a bad value is a real data error that takes the retry path.
FIELD_TYPES: Final = ("text", "bigint", "integer", "double precision", "numeric", "boolean", "jsonb")
RESERVED_COLUMNS: Final = ("event_id", "key", "payload", "event_ms", "source", "attempts", "applied_at")
_IDENT_RE: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_PATH_RE: Final = re.compile(r"[^.\s]+(\.[^.\s]+)*")
ADMIN_TOKEN_ENV: Final = "MQGATE_ADMIN_TOKEN"
# A Spark micro-batch becomes one round of worker transactions; past this the driver holds
# too many parsed events at once for no gain.
MAX_MESSAGES_PER_TRIGGER: Final = 1_000_000
MAX_PARTITIONS: Final = 1024


class PipelineConfigError(BadRequest):
    """A setting of the pipeline file is missing or wrong; `field` is its dotted key."""

    code = "pipeline_config"


class EventType(msgspec.Struct, frozen=True):
    type: str
    topic: str
    format: str
    # Dotted JSON path of the key (json, batch); None: the message's first key (keys[0]).
    key: str | None
    table: str
    fields: Mapping[str, str] = msgspec.field(default_factory=dict)
    field_types: Mapping[str, str] = msgspec.field(default_factory=dict)


class JobConfig(msgspec.Struct, frozen=True):
    name: str
    gateway: str
    admin_token: str
    checkpoint_dir: Path
    partitions: int = 16
    # Spark tasks the N worker queues are spread over; 0: half of Spark's default
    # parallelism, so the hot and retry queries find free slots while the workers wait.
    tasks: int = 0
    mode: str = "concurrent"
    max_messages_per_trigger: int = 20_000
    trigger_interval_s: float = 1.0
    starting_offsets: str = "earliest"


class HotKeyConfig(msgspec.Struct, frozen=True):
    enabled: bool
    topic: str
    # Events move off a worker whose share of the batch passes load_limit times the fair
    # share (1 / partitions), taken from its biggest keys: those with at least min_count
    # events and min_share of the batch (0: automatic, (load_limit - 1) / partitions).
    # A key with time_share of the measured processing time moves whole.
    min_count: int = 100
    min_share: float = 0.0
    max_keys: int = 8
    time_share: float = 0.25
    load_limit: float = 1.1


class RetryConfig(msgspec.Struct, frozen=True):
    topic: str
    delay_s: float = 60.0
    max_attempts: int = 5


class SinkConfig(msgspec.Struct, frozen=True):
    url: str
    batch_rows: int = 500
    # PostgreSQL sessions one executor process opens at most; workers beyond it wait their
    # turn (64 workers in 2 processes would otherwise pass max_connections = 100).
    max_connections: int = 8
    # Per-event processing cost in the worker, to model a slower sink (benchmarks).
    cost_ms: float = 0.0
    # Testing knobs: the first attempt of these keys' events (or of this share of all
    # events) fails with a real PostgreSQL error; every attempt of fail_always_keys' events.
    fail_keys: tuple[str, ...] = ()
    fail_first_attempt_share: float = 0.0
    fail_always_keys: tuple[str, ...] = ()


class AggregateConfig(msgspec.Struct, frozen=True):
    count: int = 100
    age_s: float = 300.0


class PipelineConfig(msgspec.Struct, frozen=True):
    job: JobConfig
    events: tuple[EventType, ...]
    hot_keys: HotKeyConfig
    retry: RetryConfig
    sink: SinkConfig
    aggregate: AggregateConfig

    def event_type(self, name: str) -> EventType:
        for et in self.events:
            if et.type == name:
                return et
        raise KeyError(name)

    def consumer(self, suffix: str) -> str:
        """The gateway consumer group whose offsets mirror one query's progress."""
        return f"spark-{self.job.name}-{suffix}"

    @property
    def producer(self) -> str:
        return f"spark-{self.job.name}"

    @property
    def hot_share(self) -> float:
        return self.hot_keys.min_share or (self.hot_keys.load_limit - 1.0) / self.job.partitions


def load_config(path: Path | str, env: Mapping[str, str] | None = None) -> PipelineConfig:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise PipelineConfigError(f"cannot read {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise PipelineConfigError(f"{path} is not valid TOML: {exc}") from exc
    return parse_config(raw, os.environ if env is None else env)


T = TypeVar("T")


class _Section:
    """Typed reads from one TOML table; every error names `<section>.<key>`."""

    def __init__(self, raw: object, name: str) -> None:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise PipelineConfigError(f"{name} must be a table", field=name)
        self.raw: dict[str, Any] = raw
        self.name = name
        self.used: set[str] = set()

    def key(self, k: str) -> str:
        return f"{self.name}.{k}"

    def get(self, k: str, kind: type[T] | tuple[type, ...], default: T | None = None) -> T:
        self.used.add(k)
        if k not in self.raw:
            if default is None:
                raise PipelineConfigError(f"{self.key(k)} is required", field=self.key(k))
            return default
        value = self.raw[k]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # TOML integers are fine where floats are expected; booleans are never numbers.
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) and bool not in kinds:
            raise PipelineConfigError(f"{self.key(k)} must be {_kind_name(kinds)}", field=self.key(k))
        if not isinstance(value, kinds):
            raise PipelineConfigError(f"{self.key(k)} must be {_kind_name(kinds)}", field=self.key(k))
        return value  # type: ignore[return-value]

    def number(self, k: str, default: T, low: float, high: float | None = None) -> T:
        kind: type = float if isinstance(default, float) else int
        value: Any = self.get(k, kind, default)
        if value < low or (high is not None and value > high):
            bound = f"between {low:g} and {high:g}" if high is not None else f"at least {low:g}"
            raise PipelineConfigError(f"{self.key(k)} must be {bound}, not {value}", field=self.key(k))
        return value  # type: ignore[no-any-return]

    def choice(self, k: str, choices: tuple[str, ...], default: str | None = None) -> str:
        value = self.get(k, str, default)
        if value not in choices:
            raise PipelineConfigError(
                f"{self.key(k)} must be one of {', '.join(choices)}, not {value!r}", field=self.key(k)
            )
        return value

    def name_value(self, k: str, default: str | None = None) -> str:
        value = self.get(k, str, default)
        try:
            return validate_name(value, self.key(k))
        except BadRequest as exc:
            raise PipelineConfigError(exc.message, field=self.key(k)) from exc

    def done(self) -> None:
        unknown = sorted(set(self.raw) - self.used)
        if unknown:
            raise PipelineConfigError(
                f"{self.key(unknown[0])} is not a known setting", field=self.key(unknown[0])
            )


def _kind_name(kinds: tuple[type, ...]) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list"}
    names[dict] = "a table"
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _identifier(section: _Section, k: str, value: str) -> str:
    if _IDENT_RE.fullmatch(value) is None:
        raise PipelineConfigError(
            f"{section.key(k)} {value!r} must be a lower-case SQL identifier ([a-z_][a-z0-9_]*, 63 chars)",
            field=section.key(k),
        )
    return value


def _path(section: _Section, k: str, value: str) -> str:
    if _PATH_RE.fullmatch(value) is None:
        raise PipelineConfigError(
            f"{section.key(k)} {value!r} must be a dotted JSON path such as 'video.id'", field=section.key(k)
        )
    return value


def _job(s: _Section, env: Mapping[str, str]) -> JobConfig:
    name = s.name_value("name")
    gateway = s.get("gateway", str)
    if not gateway.startswith(("http://", "https://")):
        raise PipelineConfigError(
            f"{s.key('gateway')} must be an http:// or https:// URL", field=s.key("gateway")
        )
    token = s.get("admin_token", str, "") or env.get(ADMIN_TOKEN_ENV, "")
    if not token:
        raise PipelineConfigError(
            f"{s.key('admin_token')} is required (or set {ADMIN_TOKEN_ENV})", field=s.key("admin_token")
        )
    starting = s.get("starting_offsets", str, "earliest")
    if starting not in ("earliest", "latest") and not starting.lstrip().startswith("{"):
        raise PipelineConfigError(
            f"{s.key('starting_offsets')} must be earliest, latest or a JSON object per queue",
            field=s.key("starting_offsets"),
        )
    job = JobConfig(
        name=name,
        gateway=gateway.rstrip("/"),
        admin_token=token,
        checkpoint_dir=Path(s.get("checkpoint_dir", str, f"checkpoints/{name}")),
        partitions=s.number("partitions", 16, 1, MAX_PARTITIONS),
        tasks=s.number("tasks", 0, 0, MAX_PARTITIONS),
        mode=s.choice("mode", MODES, "concurrent"),
        max_messages_per_trigger=s.number("max_messages_per_trigger", 20_000, 1, MAX_MESSAGES_PER_TRIGGER),
        trigger_interval_s=s.number("trigger_interval_s", 1.0, 0.0, 3600.0),
        starting_offsets=starting,
    )
    s.done()
    return job


def _event_type(s: _Section) -> EventType:
    fmt = s.choice("format", FORMATS, "json")
    key = s.get("key", str, "") or None
    if key is not None:
        if fmt in ("string", "bytes"):
            raise PipelineConfigError(
                f"{s.key('key')}: format {fmt} takes its key from the message keys; leave key unset",
                field=s.key("key"),
            )
        _path(s, "key", key)
    fields_section = _Section(s.get("fields", dict, {}), s.key("fields"))
    fields: dict[str, str] = {}
    for column in list(fields_section.raw):
        _identifier(fields_section, column, column)
        if column in RESERVED_COLUMNS:
            raise PipelineConfigError(
                f"{fields_section.key(column)}: {column} is a column the pipeline writes itself",
                field=fields_section.key(column),
            )
        fields[column] = _path(fields_section, column, fields_section.get(column, str))
    if fields and fmt in ("string", "bytes"):
        raise PipelineConfigError(
            f"{s.key('fields')}: format {fmt} has no JSON fields to map", field=s.key("fields")
        )
    types_section = _Section(s.get("types", dict, {}), s.key("types"))
    field_types: dict[str, str] = {}
    for column in list(types_section.raw):
        if column not in fields:
            raise PipelineConfigError(
                f"{types_section.key(column)} types a column that is not in fields",
                field=types_section.key(column),
            )
        field_types[column] = types_section.choice(column, FIELD_TYPES)
    et = EventType(
        type=s.name_value("type"),
        topic=s.name_value("topic"),
        format=fmt,
        key=key,
        table=_identifier(s, "table", s.get("table", str)),
        fields=fields,
        field_types=field_types,
    )
    s.done()
    return et


def _unique(values: list[str], what: str, key: Callable[[int], str]) -> None:
    seen: set[str] = set()
    for i, v in enumerate(values):
        if v in seen:
            raise PipelineConfigError(f"{key(i)}: {what} {v!r} is used twice", field=key(i))
        seen.add(v)


def parse_config(raw: Mapping[str, Any], env: Mapping[str, str]) -> PipelineConfig:
    sections = {"job", "events", "hot_keys", "retry", "sink", "aggregate"}
    for k in raw:
        if k not in sections:
            raise PipelineConfigError(f"{k} is not a known section", field=k)

    job = _job(_Section(raw.get("job"), "job"), env)

    raw_events = raw.get("events")
    if not isinstance(raw_events, list) or not raw_events:
        raise PipelineConfigError("events: at least one [[events]] table is required", field="events")
    events = tuple(_event_type(_Section(e, f"events[{i}]")) for i, e in enumerate(raw_events))
    _unique([e.type for e in events], "type", lambda i: f"events[{i}].type")
    _unique([e.topic for e in events], "topic", lambda i: f"events[{i}].topic")
    _unique([e.table for e in events], "table", lambda i: f"events[{i}].table")

    h = _Section(raw.get("hot_keys"), "hot_keys")
    hot = HotKeyConfig(
        enabled=h.get("enabled", bool, True),
        topic=h.name_value("topic", f"{job.name}-hot"),
        min_count=h.number("min_count", 100, 1),
        min_share=h.number("min_share", 0.0, 0.0, 1.0),
        max_keys=h.number("max_keys", 8, 0, 10_000),
        time_share=h.number("time_share", 0.25, 0.0, 1.0),
        load_limit=h.number("load_limit", 1.1, 1.0, 1000.0),
    )
    h.done()

    r = _Section(raw.get("retry"), "retry")
    retry = RetryConfig(
        topic=r.name_value("topic", f"{job.name}-retry"),
        delay_s=r.number("delay_s", 60.0, 0.0, 365 * 86400.0),
        max_attempts=r.number("max_attempts", 5, 1, 1000),
    )
    r.done()

    s = _Section(raw.get("sink"), "sink")
    url = s.get("url", str)
    if not url.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
        raise PipelineConfigError(f"{s.key('url')} must be a postgresql:// URL", field=s.key("url"))
    fail_keys, fail_always_keys = (s.get(k, list, []) for k in ("fail_keys", "fail_always_keys"))
    for k, value in (("fail_keys", fail_keys), ("fail_always_keys", fail_always_keys)):
        if not all(isinstance(v, str) for v in value):
            raise PipelineConfigError(f"{s.key(k)} must be a list of strings", field=s.key(k))
    sink = SinkConfig(
        url=url.replace("postgresql+psycopg://", "postgresql://", 1),
        batch_rows=s.number("batch_rows", 500, 1, 100_000),
        max_connections=s.number("max_connections", 8, 1, 1000),
        cost_ms=s.number("cost_ms", 0.0, 0.0, 60_000.0),
        fail_keys=tuple(fail_keys),
        fail_first_attempt_share=s.number("fail_first_attempt_share", 0.0, 0.0, 1.0),
        fail_always_keys=tuple(fail_always_keys),
    )
    s.done()

    a = _Section(raw.get("aggregate"), "aggregate")
    aggregate = AggregateConfig(count=a.number("count", 100, 1), age_s=a.number("age_s", 300.0, 0.0))
    a.done()

    topics = [e.topic for e in events]
    for name, topic in (("hot_keys.topic", hot.topic), ("retry.topic", retry.topic)):
        if topic in topics:
            raise PipelineConfigError(f"{name} {topic!r} is also an event topic", field=name)
    if hot.topic == retry.topic:
        raise PipelineConfigError("retry.topic must differ from hot_keys.topic", field="retry.topic")
    for i, et in enumerate(events):
        if et.type in ("hot", "retry"):
            raise PipelineConfigError(
                f"events[{i}].type {et.type!r} is reserved for the pipeline's own queries",
                field=f"events[{i}].type",
            )
    return PipelineConfig(job=job, events=events, hot_keys=hot, retry=retry, sink=sink, aggregate=aggregate)
