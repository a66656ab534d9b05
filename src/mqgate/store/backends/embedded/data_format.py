"""What a data directory of the embedded store is marked as (its on-disk format), and the one
reader of a topic's `topic.json`."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import msgspec

from mqgate.durable.append_file import install, write_new
from mqgate.store.interface import TopicConfig

TOPIC_FILE: Final = "topic.json"
# Bumped whenever the on-disk record format changes; a data directory of another format is
# refused rather than misread.
FORMAT_FILE: Final = "FORMAT"
FORMAT: Final = "mqgate-embedded-3 offset-records"
# Formats this build reads as they are (format 2: message records without their offset,
# records.py). Opening such a directory marks it with FORMAT, since the builds that wrote it
# would misread the records written from then on.
READS_ALSO: Final = frozenset({"mqgate-embedded-2 json-records"})

_decode_topic = msgspec.json.Decoder(TopicConfig).decode


def data_format(root: Path, topics_dir: Path) -> str:
    """The directory's format; a new, empty directory is marked with this build's."""
    path = root / FORMAT_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        if any(topics_dir.iterdir()):
            return "mqgate-embedded-1 (unmarked)"
        mark_format(root)
        return FORMAT


def mark_format(root: Path) -> None:
    """Mark the directory with this build's format, durably."""
    tmp = root / (FORMAT_FILE + ".tmp")
    write_new(tmp, [(FORMAT + "\n").encode()]).close()
    install(tmp, root / FORMAT_FILE)


def read_topic_config(topic_dir: Path) -> TopicConfig:
    """The configuration in a topic directory's topic.json: FileNotFoundError when there is
    none (an unfinished creation), ValueError saying what is wrong when it is not that topic's."""
    raw = (topic_dir / TOPIC_FILE).read_bytes()
    try:
        config = _decode_topic(raw)
    except msgspec.MsgspecError as exc:
        raise ValueError(str(exc)) from exc
    if config.name != topic_dir.name:
        raise ValueError(f"it names topic {config.name!r}")
    if config.queues < 1:
        raise ValueError(f"it gives {config.queues} queues")
    return config


def write_topic_config(topic_dir: Path, config: TopicConfig) -> None:
    """Write topic.json durably (a crash leaves the old file or the new one, never a torn one)."""
    topic_dir.mkdir(parents=True, exist_ok=True)
    tmp = topic_dir / (TOPIC_FILE + ".tmp")
    write_new(tmp, [msgspec.json.encode(config)]).close()
    install(tmp, topic_dir / TOPIC_FILE)
