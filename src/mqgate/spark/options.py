"""The `mqgate` format's options, checked once when a reader or writer is made.

Spark hands options over lower-cased; errors name them as the user wrote them (camelCase).
An option that looks like a misspelt known one (`startingOffset`) is an error, not ignored.
"""

from __future__ import annotations

import difflib
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import msgspec

from mqgate.errors import MqgateError
from mqgate.names import validate_name, validate_topic_name
from mqgate.spark.offsets import EARLIEST, LATEST, Offsets, OptionError, parse_spec

MAX_READ_BATCH: Final = 10_000  # the gateway's /mq/read limit
DEFAULT_READ_BATCH: Final = 10_000
DEFAULT_BROKER: Final = "local"  # the gateway's default broker_name
READER_OPTIONS: Final = (
    "gateway", "store", "redisPrefix", "broker", "topic", "token", "consumer",
    "startingOffsets", "endingOffsets", "maxMessagesPerTrigger", "readBatchSize",
)  # fmt: skip
WRITER_OPTIONS: Final = (
    "gateway", "producer", "token",
    "progressConsumer", "progressToken", "progressGateway", "progressStateDir",
)  # fmt: skip


def _check_known(options: Mapping[str, str], known: tuple[str, ...], role: str) -> None:
    """Refuse an option that looks like a misspelt known one. Others pass: Spark adds its
    own (checkpointLocation, path, ...) to what a source or sink sees."""
    names = {k.lower(): k for k in known}
    for key in options:
        if key.lower() in names:
            continue
        close = difflib.get_close_matches(key.lower(), list(names), n=1, cutoff=0.8)
        if close:
            raise OptionError(
                f"unknown {role} option {key!r}: did you mean {names[close[0]]}? "
                f"The mqgate {role} takes {', '.join(known)}",
                field=key,
            )


def _get(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name.lower(), options.get(name))
    if value is None or not str(value).strip():
        return None
    return str(value).strip()


def _require(options: Mapping[str, str], name: str, what: str) -> str:
    value = _get(options, name)
    if value is None:
        raise OptionError(f"option {name} is required: {what}", field=name)
    return value


def _int(options: Mapping[str, str], name: str, lo: int, hi: int | None) -> int | None:
    text = _get(options, name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"option {name} must be an integer, not {text!r}", field=name) from None
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise OptionError(f"option {name} must be {bound}, not {value}", field=name)
    return value


def _url(options: Mapping[str, str], name: str, schemes: tuple[str, ...]) -> str | None:
    url = _get(options, name)
    if url is not None and not url.lower().startswith(schemes):
        raise OptionError(f"option {name} must be a {' or '.join(schemes)} URL, not {url!r}", field=name)
    return url


def _name(options: Mapping[str, str], name: str, value: str) -> str:
    try:
        return validate_topic_name(value, name) if name == "topic" else validate_name(value, name)
    except MqgateError as exc:
        raise OptionError(f"option {exc.message}", field=name) from None


class ReadOptions(msgspec.Struct, frozen=True):
    topic: str
    gateway: str | None  # one of gateway and store is set
    store: str | None
    redis_prefix: str
    broker: str  # the broker column when reading the store directly
    token: str | None
    consumer: str | None
    starting: str | Offsets
    ending: str | Offsets | None
    max_per_trigger: int | None
    read_batch: int


def read_options(options: Mapping[str, str], streaming: bool) -> ReadOptions:
    _check_known(options, READER_OPTIONS, "reader")
    gateway = _url(options, "gateway", ("http://", "https://"))
    store = _url(options, "store", ("redis://", "rediss://", "unix://"))
    if (gateway is None) == (store is None):
        raise OptionError(
            "set exactly one of option gateway (an http URL) and option store (a redis:// URL)",
            field="gateway",
        )
    topic = _name(options, "topic", _require(options, "topic", "the topic to read"))
    token = _get(options, "token")
    if gateway is not None and token is None:
        raise OptionError("option token is required with gateway: an admin or consumer token", field="token")
    consumer = _get(options, "consumer")
    if consumer is not None:
        consumer = _name(options, "consumer", consumer)
    ending_text = _get(options, "endingOffsets")
    if streaming and ending_text is not None:
        raise OptionError(
            "option endingOffsets is for batch reads only, not streaming", field="endingOffsets"
        )
    max_per_trigger = _int(options, "maxMessagesPerTrigger", 1, None)
    if not streaming and max_per_trigger is not None:
        raise OptionError(
            "option maxMessagesPerTrigger is for streaming reads only (use endingOffsets)",
            field="maxMessagesPerTrigger",
        )
    return ReadOptions(
        topic=topic,
        gateway=gateway,
        store=store,
        redis_prefix=_get(options, "redisPrefix") or "mq",
        broker=_name(options, "broker", _get(options, "broker") or DEFAULT_BROKER),
        token=token,
        consumer=consumer,
        starting=parse_spec(
            _get(options, "startingOffsets"), "startingOffsets", EARLIEST, (EARLIEST, LATEST)
        ),
        ending=None if streaming else parse_spec(ending_text, "endingOffsets", LATEST, (LATEST,)),
        max_per_trigger=max_per_trigger,
        read_batch=_int(options, "readBatchSize", 1, MAX_READ_BATCH) or DEFAULT_READ_BATCH,
    )


class WriteOptions(msgspec.Struct, frozen=True):
    gateway: str
    producer: str
    token: str
    progress_consumer: str | None
    progress_token: str
    progress_gateway: str
    progress_state_dir: Path


def write_options(options: Mapping[str, str]) -> WriteOptions:
    _check_known(options, WRITER_OPTIONS, "writer")
    gateway = _url(options, "gateway", ("http://", "https://"))
    if gateway is None:
        raise OptionError("option gateway is required: the gateway's http URL", field="gateway")
    token = _require(options, "token", "the producer's token or the admin token")
    producer = _name(
        options, "producer", _require(options, "producer", "the registered producer to write as")
    )
    progress = _get(options, "progressConsumer")
    state_dir = _get(options, "progressStateDir")
    return WriteOptions(
        gateway=gateway,
        producer=producer,
        token=token,
        progress_consumer=None if progress is None else _name(options, "progressConsumer", progress),
        progress_token=_get(options, "progressToken") or token,
        progress_gateway=_url(options, "progressGateway", ("http://", "https://")) or gateway,
        progress_state_dir=Path(state_dir or Path(tempfile.gettempdir()) / "mqgate-spark-progress"),
    )
