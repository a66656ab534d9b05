"""Validation of every name that reaches the data directory or the registry."""

from __future__ import annotations

import re
from typing import Final

from mqgate.errors import BadRequest

NAME_MAX_CHARS: Final = 128
_NAME_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,128}")
DLQ_PREFIX: Final = "%DLQ%"
TRACE_PREFIX: Final = "%TRACE%"
# Topics the gateway makes for each consumer (dead letters, redelivery with backoff, inbox) and
# for each traced project (its trace events).
INTERNAL_PREFIXES: Final = (DLQ_PREFIX, "%RETRY%", "%INBOX%", TRACE_PREFIX)
# Names a compatibility edge makes its own records under (the SQS API: `sqs.<account>.<queue>`
# and its `.c` consumer and `.p` producer): no other door may take one, so no native topic can
# stand where an account's queue would be.
RESERVED_PREFIXES: Final = {
    "sqs.": "the SQS API's queues (docs/SQS.md)",
    "aliyun.": "the Aliyun MQ API's half messages (docs/ALIYUN.md)",
}
# The offsets group that records what was redriven from a consumer's dead letters.
REDRIVE_PREFIX: Final = "%REDRIVE%"


def validate_name(value: object, field: str) -> str:
    """Return `value` if it is a legal name, else raise a 400 naming `field`.

    Only `[A-Za-z0-9._-]` is allowed and `.`/`..` are refused, so no name can form a path
    outside the data directory.
    """
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{field} is required", field=field)
    if len(value) > NAME_MAX_CHARS:
        raise BadRequest(f"{field} is longer than {NAME_MAX_CHARS} characters", field=field)
    if _NAME_RE.fullmatch(value) is None or value in (".", ".."):
        raise BadRequest(f"{field} {value!r} may only contain letters, digits, '.', '_' and '-'", field=field)
    return value


def dlq_topic(consumer: str) -> str:
    return f"{DLQ_PREFIX}{consumer}"


def validate_topic_name(value: object, field: str = "topic") -> str:
    """Topics may also be one of a consumer's own topics, e.g. `%DLQ%<consumer>`."""
    if isinstance(value, str):
        for prefix in INTERNAL_PREFIXES:
            if value.startswith(prefix):
                validate_name(value[len(prefix) :], field)
                return value
    return validate_name(value, field)


def refuse_reserved(name: str, field: str) -> None:
    """A 400 naming `field` if `name` is under a reserved prefix (see RESERVED_PREFIXES)."""
    for prefix, owner in RESERVED_PREFIXES.items():
        if name.startswith(prefix):
            raise BadRequest(f"names starting with {prefix!r} are reserved for {owner}", field=field)
