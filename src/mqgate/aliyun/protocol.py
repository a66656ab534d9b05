"""The request line of Alibaba Cloud MQ's HTTP API: `/topics/{topic}/messages` and its query,
read into one `AliyunRequest` with every limit explicit (pure).

The query is split as the SDKs write it (`k=v` joined by `&`; only `tag` is percent-encoded, but
every value is decoded), each parameter at most once, none the operation does not take: a
parameter out of its range is InvalidArgument naming it, an unknown or repeated one
InvalidQueryString, a path the API does not have InvalidRequestURL.
"""

from __future__ import annotations

import re
from typing import Final, Literal
from urllib.parse import unquote

import msgspec

from mqgate.aliyun import errors
from mqgate.aliyun.detect import PATH
from mqgate.aliyun.errors import AliyunError

TOPIC_NAME: Final = re.compile(r"[A-Za-z0-9._-]{1,128}")
MAX_QUERY_BYTES: Final = 4096
MIN_MESSAGES: Final = 1
MAX_MESSAGES: Final = 16  # numOfMessages, as the service allows
MAX_WAIT_S: Final = 30  # waitseconds, as the service allows
MAX_TAG_FILTER_CHARS: Final = 1024  # a whole `TagA||TagB` filter
MAX_TAGS_IN_FILTER: Final = 32
MAX_GROUP_CHARS: Final = 128
MAX_INSTANCE_CHARS: Final = 128

Operation = Literal["publish", "consume", "ack"]
Trans = Literal["", "order", "pop", "commit", "rollback"]

_PARAMETERS: Final[dict[str, frozenset[str]]] = {
    "POST": frozenset({"ns"}),
    "GET": frozenset({"consumer", "numOfMessages", "ns", "waitseconds", "tag", "trans"}),
    "DELETE": frozenset({"consumer", "ns", "trans"}),
}
_OPERATIONS: Final[dict[str, Operation]] = {"POST": "publish", "GET": "consume", "DELETE": "ack"}
_TRANS_VALUES: Final[dict[str, Trans]] = {
    "": "",
    "order": "order",
    "pop": "pop",
    "commit": "commit",
    "rollback": "rollback",
}
_TRANS: Final[dict[str, frozenset[str]]] = {
    "GET": frozenset({"order", "pop"}),
    "DELETE": frozenset({"commit", "rollback"}),
}


class AliyunRequest(msgspec.Struct, frozen=True):
    operation: Operation
    topic: str
    instance: str  # `ns`: "" for none (the key's project)
    group: str  # `consumer`: "" on a publish
    max_messages: int
    wait_s: int
    tags: frozenset[str] | None  # the tag filter; None: every message
    trans: Trans

    @property
    def label(self) -> str:
        """The operation as metrics and logs name it."""
        return f"{self.operation}:{self.trans}" if self.trans else self.operation


def _query_error(message: str, name: str) -> AliyunError:
    return AliyunError(errors.INVALID_QUERY_STRING, message, element=name)


def _argument(message: str, name: str) -> AliyunError:
    return AliyunError(errors.INVALID_ARGUMENT, message, element=name)


def parse_query(query: str, allowed: frozenset[str]) -> dict[str, str]:
    """`k=v&k=v` -> {k: decoded v}: each name at most once and one of `allowed`."""
    if len(query) > MAX_QUERY_BYTES:
        raise _query_error(f"The query string is longer than {MAX_QUERY_BYTES} bytes.", "query")
    out: dict[str, str] = {}
    for part in query.split("&"):
        if not part:
            continue
        name, _, value = part.partition("=")
        if name not in allowed:
            raise _query_error(
                f"The query parameter {name[:64]!r} is not one this operation takes.", name[:64]
            )
        if name in out:
            raise _query_error(f"The query parameter {name} is given more than once.", name)
        out[name] = unquote(value, errors="strict") if "%" in value else value
    return out


def _whole(params: dict[str, str], name: str, low: int, high: int, default: int) -> int:
    text = params.get(name)
    if text is None or text == "":
        return default
    if not text.isdigit() or len(text) > 6 or not low <= int(text) <= high:
        raise _argument(f"{name} must be a whole number from {low} to {high}, not {text[:32]!r}.", name)
    return int(text)


def parse_tag_filter(text: str) -> frozenset[str] | None:
    """`TagA||TagB` -> {TagA, TagB}; "" or `*`: no filter."""
    if not text or text.strip() == "*":
        return None
    if len(text) > MAX_TAG_FILTER_CHARS:
        raise _argument(f"tag is longer than {MAX_TAG_FILTER_CHARS} characters.", "tag")
    tags = [t.strip() for t in text.split("||")]
    if any(not t or "|" in t for t in tags) or len(tags) > MAX_TAGS_IN_FILTER:
        raise _argument(
            f"tag must be 1 to {MAX_TAGS_IN_FILTER} tags separated by '||', none empty: {text[:64]!r}.", "tag"
        )
    if "*" in tags:
        return None
    return frozenset(tags)


def parse_request(method: str, path: str, query: str) -> AliyunRequest:
    """The operation a request line names, or the service's error."""
    matched = PATH.fullmatch(path)
    operation = _OPERATIONS.get(method)
    if matched is None or operation is None:
        raise AliyunError(
            errors.INVALID_REQUEST_URL,
            f"{method} {path[:200]} is not an operation of this API: POST, GET or DELETE "
            "/topics/{topic}/messages.",
        )
    try:
        topic = unquote(matched.group(1), errors="strict")
        params = parse_query(query, _PARAMETERS[method])
    except UnicodeDecodeError:
        raise AliyunError(errors.INVALID_REQUEST_URL, "The request URL is not valid UTF-8.") from None
    if TOPIC_NAME.fullmatch(topic) is None:
        raise AliyunError(
            errors.TOPIC_NOT_EXIST, f"The topic {topic[:128]!r} does not exist.", element="topic"
        )
    instance = params.get("ns", "")
    if len(instance) > MAX_INSTANCE_CHARS:
        raise _argument(f"ns is longer than {MAX_INSTANCE_CHARS} characters.", "ns")
    group = params.get("consumer", "")
    if operation != "publish":
        if not group:
            raise _argument("consumer (the group id) is required.", "consumer")
        if len(group) > MAX_GROUP_CHARS:
            raise _argument(f"consumer is longer than {MAX_GROUP_CHARS} characters.", "consumer")
    trans = params.get("trans", "")
    if trans and trans not in _TRANS.get(method, frozenset()):
        allowed = " or ".join(sorted(_TRANS.get(method, frozenset()))) or "nothing"
        raise _argument(f"trans must be {allowed} for a {method}, not {trans[:32]!r}.", "trans")
    return AliyunRequest(
        operation=operation,
        topic=topic,
        instance=instance,
        group=group,
        max_messages=_whole(params, "numOfMessages", MIN_MESSAGES, MAX_MESSAGES, 1),
        wait_s=_whole(params, "waitseconds", 0, MAX_WAIT_S, 0),
        tags=parse_tag_filter(params.get("tag", "")),
        trans=_TRANS_VALUES[trans],  # checked against _TRANS above
    )
