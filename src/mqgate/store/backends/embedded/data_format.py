"""What a data directory of the embedded store is marked as: its on-disk format."""

from __future__ import annotations

from pathlib import Path
from typing import Final

TOPIC_FILE: Final = "topic.json"
# Bumped whenever the on-disk record format changes; a data directory of another format is
# refused rather than misread.
FORMAT_FILE: Final = "FORMAT"
FORMAT: Final = "mqgate-embedded-2 json-records"


def data_format(root: Path, topics_dir: Path) -> str:
    """The directory's format; a new, empty directory is marked with this build's."""
    path = root / FORMAT_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        if any(topics_dir.iterdir()):
            return "mqgate-embedded-1 (unmarked)"
        path.write_text(FORMAT + "\n")
        return FORMAT
