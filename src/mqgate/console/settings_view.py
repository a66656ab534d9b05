"""The settings in force as an admin sees them: each value, where it came from, what it means,
with secrets hidden (a token or a password in a URL never reaches a page)."""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any, Final

import msgspec

from mqgate import settings as settings_module
from mqgate.console.formats import number, retention, size
from mqgate.settings import Settings, setting_fields
from mqgate.urls import redact

# A setting whose name has one of these is hidden whole (a webhook URL carries its secret in
# its path, as Slack's do).
SECRET_WORDS: Final = ("token", "secret", "password", "webhook_url")
_URL: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s,]+")
_SECRET_PARAM: Final = re.compile(
    r"([?&;](?:password|passwd|pass|pwd|token|secret|key|auth)[^=&;]*=)[^&;]*", re.I
)
_FIELD: Final = re.compile(r"^    (\w+): ")


class SettingRow(msgspec.Struct, frozen=True):
    name: str
    value: str
    source: str  # "default", "file …", "env MQGATE_…", "command line", "set by the program"
    default: str
    help: str
    human: str = ""  # the value as people say it ("64.00 MiB", "7 days"), when that differs


def setting_rows(s: Settings) -> list[SettingRow]:
    helps = help_texts()
    defaults = Settings()
    rows = []
    for f in setting_fields():
        value, default = getattr(s, f.name), getattr(defaults, f.name)
        source = s.sources.get(f.name) or ("default" if value == default else "set by the program")
        rows.append(
            SettingRow(
                f.name,
                shown(f.name, value),
                source,
                shown(f.name, default),
                helps.get(f.name, ""),
                human(f.name, value),
            )
        )
    return rows


def human(name: str, value: Any) -> str:
    """A number setting as people say it, when that is not how it is written: bytes in KiB,
    MiB or GiB, a time in days, hours, minutes or seconds, a large count with separators;
    "" otherwise (ports, small counts, text)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return ""
    if name.endswith("_bytes"):
        text = size(int(value))
    elif name.endswith("_ms"):
        text = retention(int(value)) if value > 0 else ""
    elif name.endswith("_s"):
        text = retention(round(value * 1000)) if value > 0 else ""
    elif isinstance(value, int) and value >= 10_000 and name != "port":
        text = number(value)
    else:
        text = ""
    return "" if text in (str(value), f"{value} bytes") else text


def shown(name: str, value: Any) -> str:
    text = str(value)
    if any(word in name for word in SECRET_WORDS):
        return "(set, hidden)" if text else "(empty)"
    if "://" in text:  # each URL of it (a list of clusters has several) without its secrets
        return _URL.sub(lambda m: _SECRET_PARAM.sub(r"\1***", redact(m.group(0))), text)
    return text if text else "(empty)"


def help_texts() -> dict[str, str]:
    """Each setting's meaning: the comment in settings.py above its field, or above the run of
    fields it belongs to (a group's comment applies to each field up to the next comment or
    blank line). One text for the code's readers and the page's."""
    return dict(_help_texts())


@functools.cache
def _help_texts() -> dict[str, str]:
    helps: dict[str, str] = {}
    comment: list[str] = []  # the comment lines being read
    group = ""  # the comment over the run of fields being read
    for line in inspect.getsource(settings_module.Settings).splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append(stripped.lstrip("#").strip())
            continue
        if comment:
            group, comment = " ".join(comment), []
        m = _FIELD.match(line)
        if m:
            if group:
                helps[m.group(1)] = group
        elif not stripped:  # a blank line ends the run
            group = ""
    return helps
