"""The request line of Alibaba Cloud MQ's HTTP API read into one request, with its limits
(mqgate.aliyun.protocol, pure)."""

from __future__ import annotations

import pytest

from mqgate.aliyun.detect import is_aliyun_path
from mqgate.aliyun.errors import AliyunError
from mqgate.aliyun.protocol import parse_request, parse_tag_filter

PATH = "/topics/orders/messages"


def code(method: str, path: str, query: str) -> tuple[str, str | None]:
    with pytest.raises(AliyunError) as refused:
        parse_request(method, path, query)
    return refused.value.kind.code, refused.value.element


def test_the_sdks_requests() -> None:
    # Python's order for a consume; the tag percent-encoded.
    r = parse_request(
        "GET",
        PATH,
        "consumer=GID_a&numOfMessages=16&ns=MQ_INST_1&waitseconds=30&tag=TagA%7C%7CTagB&trans=order",
    )
    assert (r.operation, r.topic, r.group, r.instance) == ("consume", "orders", "GID_a", "MQ_INST_1")
    assert (r.max_messages, r.wait_s, r.tags, r.trans) == (16, 30, frozenset({"TagA", "TagB"}), "order")
    assert r.label == "consume:order"
    # Node's order, no waitseconds (0), an empty ns.
    r = parse_request("GET", PATH, "consumer=GID_a&ns=&tag=TagA&numOfMessages=3")
    assert (r.instance, r.wait_s, r.max_messages, r.tags) == ("", 0, 3, frozenset({"TagA"}))
    assert parse_request("POST", PATH, "ns=MQ_INST_1").operation == "publish"
    assert parse_request("POST", PATH, "").instance == ""
    r = parse_request("DELETE", PATH, "consumer=GID_a&ns=x&trans=rollback")
    assert (r.operation, r.trans) == ("ack", "rollback")
    assert parse_request("GET", PATH, "consumer=GID_a&trans=pop&numOfMessages=1").trans == "pop"


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("PUT", PATH, "", ("InvalidRequestURL", None)),
        ("GET", "/topics/orders", "consumer=a", ("InvalidRequestURL", None)),
        ("GET", "/topics/a/b/messages", "consumer=a", ("InvalidRequestURL", None)),
        ("GET", "/topics/%25DLQ%25x/messages", "consumer=a", ("TopicNotExist", "topic")),
        ("GET", PATH, "numOfMessages=1", ("InvalidArgument", "consumer")),
        ("GET", PATH, "consumer=a&numOfMessages=0", ("InvalidArgument", "numOfMessages")),
        ("GET", PATH, "consumer=a&numOfMessages=17", ("InvalidArgument", "numOfMessages")),
        ("GET", PATH, "consumer=a&numOfMessages=-1", ("InvalidArgument", "numOfMessages")),
        ("GET", PATH, "consumer=a&waitseconds=31", ("InvalidArgument", "waitseconds")),
        ("GET", PATH, "consumer=a&waitseconds=1e3", ("InvalidArgument", "waitseconds")),
        ("GET", PATH, "consumer=a&trans=commit", ("InvalidArgument", "trans")),
        ("DELETE", PATH, "consumer=a&trans=order", ("InvalidArgument", "trans")),
        ("POST", PATH, "ns=a&consumer=b", ("InvalidQueryString", "consumer")),
        ("GET", PATH, "consumer=a&consumer=b", ("InvalidQueryString", "consumer")),
        ("GET", PATH, "consumer=a&bogus=1", ("InvalidQueryString", "bogus")),
        ("GET", PATH, "consumer=a&tag=A%7C%7C", ("InvalidArgument", "tag")),
        ("GET", PATH, "consumer=" + "g" * 129, ("InvalidArgument", "consumer")),
        ("GET", PATH, "consumer=a&ns=" + "n" * 129, ("InvalidArgument", "ns")),
        ("GET", PATH, "consumer=a&x=" + "q" * 5000, ("InvalidQueryString", "query")),
        ("GET", PATH, "consumer=%ff", ("InvalidRequestURL", None)),
    ],
)
def test_refusals_name_what_is_wrong(
    method: str, path: str, query: str, expected: tuple[str, str | None]
) -> None:
    assert code(method, path, query) == expected


def test_tag_filters() -> None:
    assert parse_tag_filter("") is None
    assert parse_tag_filter("*") is None
    assert parse_tag_filter("A||*") is None
    assert parse_tag_filter(" A || B ") == frozenset({"A", "B"})
    with pytest.raises(AliyunError):
        parse_tag_filter("A|B")
    with pytest.raises(AliyunError):
        parse_tag_filter("||".join(["t"] * 33))


def test_paths_of_this_api() -> None:
    assert is_aliyun_path(PATH)
    assert not is_aliyun_path("/topics/orders/messages/x")
    assert not is_aliyun_path("/mq/produce")
