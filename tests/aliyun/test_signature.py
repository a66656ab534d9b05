"""The MQ signature: requests the official SDKs signed verify, tampered ones are refused with the
service's codes. The Python SDK (`mq-http-sdk`, from the dev lock) signs live over random
inputs; the Node SDK's requests were recorded once from `@aliyunmq/mq-http-sdk` 1.0.4 into
node_sdk_requests.json (the suite does not install Node packages for this module)."""

from __future__ import annotations

import base64
import hashlib
import json
import string
import time
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mq_http_sdk.mq_producer import TopicMessage

from mqgate.aliyun import errors
from mqgate.aliyun import signature as sig
from mqgate.aliyun.errors import AliyunError
from tests.aliyun.python_sdk import Recorder, Sent, client

NODE = json.loads((Path(__file__).parent / "node_sdk_requests.json").read_text())

names = st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=40)
key_ids = st.text(string.ascii_letters + string.digits, min_size=1, max_size=40)
secrets = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)
xml_text = st.text(
    st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\ufffe\uffff"),
    min_size=1,
    max_size=200,
)
tags = st.text(string.ascii_letters + string.digits + "_-. ", min_size=1, max_size=20).filter(str.strip)


def lookup_of(key_id: str, secret: str) -> sig.Lookup:
    return {key_id: secret}.get


def refused(kind: errors.ErrorKind, sent: Sent, lookup: sig.Lookup, **change: Any) -> None:
    method = change.pop("method", sent.method)
    uri = change.pop("uri", sent.uri)
    headers = change.pop("headers", sent.headers)
    now = change.pop("now", time.time())
    with pytest.raises(AliyunError) as caught:
        sig.verify(method, headers, uri, lookup, now)
    assert caught.value.kind is kind, caught.value.message
    assert caught.value.code == kind.code and caught.value.http_status == kind.http_status


def drive_python_sdk(key_id: str, secret: str, topic: str, instance: str, body: str, tag: str) -> list[Sent]:
    """Every request shape the Python SDK sends: publish (plain, delayed, ordered, transactional),
    consume (tag filter, long poll, orderly, half messages), ack, commit, rollback."""
    recorder = Recorder()
    c = client(key_id, secret, recorder)
    producer = c.get_producer(instance, topic)
    message = TopicMessage(body, tag)
    message.put_property("color", "blue")
    message.set_message_key("k-1")
    producer.publish_message(message)
    delayed = TopicMessage(body)
    delayed.set_start_deliver_time(int(time.time() * 1000) + 5000)
    producer.publish_message(delayed)
    ordered = TopicMessage(body, tag)
    ordered.set_sharding_key("customer-7")
    producer.publish_message(ordered)
    consumer = c.get_consumer(instance, topic, f"GID_{topic}", f"{tag}||TagB")
    consumer.consume_message(16, 30)
    consumer.consume_message_orderly(3)
    consumer.ack_message(["RH-1", "RH-2"])
    trans = c.get_trans_producer(instance, topic, "GID_trans")
    half = TopicMessage(body, tag)
    half.set_trans_check_immunity_time(10)
    trans.publish_message(half)
    trans.consume_half_message(1, 3)
    trans.commit("RH-commit")
    trans.rollback("RH-rollback")
    return recorder.sent


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key_ids, secrets, names, st.one_of(st.just(""), names), xml_text, tags)
def test_what_the_python_sdk_signs_verifies(
    key_id: str, secret: str, topic: str, instance: str, body: str, tag: str
) -> None:
    sent = drive_python_sdk(key_id, secret, topic, instance, body, tag)
    assert [s.method for s in sent] == ["POST"] * 3 + [
        "GET",
        "GET",
        "DELETE",
        "POST",
        "GET",
        "DELETE",
        "DELETE",
    ]
    lookup = lookup_of(key_id, secret)
    for s in sent:
        verified = sig.verify(s.method, s.headers, s.uri, lookup, time.time())
        assert verified.access_key_id == key_id
        assert verified.version == sig.VERSION
        assert s.headers["Authorization"] == sig.authorization(key_id, secret, s.method, s.headers, s.uri)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key_ids, secrets, names, xml_text, tags)
def test_tampered_python_sdk_requests_are_refused(
    key_id: str, secret: str, topic: str, body: str, tag: str
) -> None:
    lookup = lookup_of(key_id, secret)
    for s in drive_python_sdk(key_id, secret, topic, "MQ_INST_1", body, tag):
        refused(errors.SIGNATURE_DOES_NOT_MATCH, s, lookup_of(key_id, secret + "x"))
        refused(errors.INVALID_ACCESS_KEY_ID, s, {}.get)
        refused(errors.SIGNATURE_DOES_NOT_MATCH, s, lookup, method="PUT")
        refused(errors.SIGNATURE_DOES_NOT_MATCH, s, lookup, uri=s.uri + "&numOfMessages=1")
        refused(errors.SIGNATURE_DOES_NOT_MATCH, s, lookup, uri=s.uri.replace(topic, topic + "x", 1))
        refused(
            errors.SIGNATURE_DOES_NOT_MATCH, s, lookup, headers={**s.headers, "x-mq-version": "2015-06-07"}
        )
        refused(errors.SIGNATURE_DOES_NOT_MATCH, s, lookup, headers={**s.headers, "x-mq-extra": "1"})
        refused(
            errors.SIGNATURE_DOES_NOT_MATCH, s, lookup, headers={**s.headers, "content-type": "text/plain"}
        )
        refused(errors.SIGNATURE_DOES_NOT_MATCH, s, lookup, headers={**s.headers, "content-md5": "AAAA"})
        later = formatdate(sig.parse_date(s.headers["date"]) + 1, usegmt=True)
        refused(errors.SIGNATURE_DOES_NOT_MATCH, s, lookup, headers={**s.headers, "date": later})
        # A header outside the signature may change; a security token is reported, not checked.
        changed = {**s.headers, "user-agent": "another", "security-token": "sts-1"}
        assert sig.verify(s.method, changed, s.uri, lookup, time.time()).security_token == "sts-1"


def one_python_request() -> tuple[Sent, sig.Lookup]:
    sent = drive_python_sdk("AKID", "secret", "orders", "MQ_INST_1", "hello", "TagA")
    return sent[0], lookup_of("AKID", "secret")


def test_a_request_signed_too_long_ago_or_ahead_is_time_expired() -> None:
    s, lookup = one_python_request()
    signed = sig.parse_date(s.headers["date"])
    for now in (signed + sig.MAX_SKEW_S + 2, signed - sig.MAX_SKEW_S - 2):
        refused(errors.TIME_EXPIRED, s, lookup, now=now)
    assert sig.verify(s.method, s.headers, s.uri, lookup, signed + sig.MAX_SKEW_S - 1).signed_at == signed
    with pytest.raises(AliyunError) as caught:
        sig.verify(s.method, s.headers, s.uri, lookup, signed + 61, max_skew_s=60)
    assert caught.value.kind is errors.TIME_EXPIRED
    # The signature is checked first: a wrong secret stays SignatureDoesNotMatch at any time.
    refused(errors.SIGNATURE_DOES_NOT_MATCH, s, lookup_of("AKID", "other"), now=signed + 3600)


def test_the_authorization_and_date_headers_are_checked_before_the_key() -> None:
    s, lookup = one_python_request()
    without = {k: v for k, v in s.headers.items() if k != "Authorization"}
    refused(errors.MISSING_AUTHORIZATION_HEADER, s, lookup, headers=without)
    refused(errors.MISSING_AUTHORIZATION_HEADER, s, lookup, headers={**without, "authorization": " "})
    good = s.headers["Authorization"]
    sig_part = good.rpartition(":")[2]
    for bad in (
        "MQ",
        "MQ AKID",
        f"MQ AKID{sig_part}",
        f"AWS AKID:{sig_part}",
        f"mq AKID:{sig_part}",
        f"MQ  AKID:{sig_part}",
        f"MQ :{sig_part}",
        f"MQ AKID:{sig_part}=",
        "MQ AKID:" + "!" * 28,
        f"MQ AK ID:{sig_part}",
    ):
        refused(errors.INVALID_AUTHORIZATION_HEADER, s, lookup, headers={**without, "Authorization": bad})
    flipped = good[:-2] + ("A" if good[-2] != "A" else "B") + good[-1]
    refused(errors.SIGNATURE_DOES_NOT_MATCH, s, lookup, headers={**without, "Authorization": flipped})
    undated = {k: v for k, v in s.headers.items() if k != "date"}
    refused(errors.MISSING_DATE_HEADER, s, lookup, headers=undated)
    for bad_date in ("yesterday", "Thu, 07 Mar 2012 18:49:58 +0800", "2012-03-07T18:49:58Z"):
        refused(errors.INVALID_DATE_HEADER, s, lookup, headers={**undated, "date": bad_date})
    # Header names are case-insensitive, as HTTP has them.
    upper = {k.upper(): v for k, v in s.headers.items()}
    assert sig.verify(s.method, upper, s.uri, lookup, time.time()).access_key_id == "AKID"
    # (name, value) pairs, as an ASGI scope carries them.
    assert sig.verify(s.method, list(s.headers.items()), s.uri, lookup, time.time()).access_key_id == "AKID"


def test_the_string_to_sign() -> None:
    headers = {
        "Date": "Thu, 07 Mar 2012 18:49:58 GMT",
        "X-MQ-Version": "2015-06-06",
        "x-mq-b": "2",
        "x-mq-a": "1",
        "Content-Type": "text/xml;charset=utf-8",
        "Content-MD5": "MD5==",
        "User-Agent": "ignored",
    }
    assert sig.string_to_sign("POST", headers, "/topics/t/messages?ns=i") == (
        "POST\nMD5==\ntext/xml;charset=utf-8\nThu, 07 Mar 2012 18:49:58 GMT\n"
        "x-mq-a:1\nx-mq-b:2\nx-mq-version:2015-06-06\n/topics/t/messages?ns=i"
    )
    bare = {"date": "Thu, 07 Mar 2012 18:49:58 GMT", "x-mq-version": "2015-06-06"}
    to_sign = sig.string_to_sign("GET", bare, "/topics/t/messages?consumer=GID_a")
    expected = "GET\n\n\nThu, 07 Mar 2012 18:49:58 GMT\nx-mq-version:2015-06-06\n"
    assert to_sign == expected + "/topics/t/messages?consumer=GID_a"
    # The HMAC-SHA1 of it, base64: the Python SDK's own signer gives the same.
    c = client("ak", "sk", Recorder())
    assert c.get_signature("GET", bare, "/topics/t/messages?consumer=GID_a") == (
        sig.authorization("ak", "sk", "GET", bare, "/topics/t/messages?consumer=GID_a")
    )
    assert sig.parse_date("Thu, 07 Mar 2012 18:49:58 GMT") == 1331146198


@pytest.mark.parametrize("request_", NODE["requests"], ids=lambda r: f"{r['method']} {r['url']}")
def test_what_the_node_sdk_signed_verifies(request_: dict[str, Any]) -> None:
    lookup = lookup_of(NODE["accessKeyId"], NODE["accessKeySecret"])
    headers: dict[str, str] = request_["headers"]
    now = sig.parse_date(headers["date"]) + 3
    verified = sig.verify(request_["method"], headers, request_["url"], lookup, now)
    assert verified.access_key_id == NODE["accessKeyId"]
    body = request_["body"].encode()
    sig.check_content_md5(headers.get("content-md5"), body)
    if request_["method"] != "GET":
        # The Node SDK's Content-MD5 is the base64 of the hex digest; a changed body is refused.
        assert headers["content-md5"] == base64.b64encode(hashlib.md5(body).hexdigest().encode()).decode()
        with pytest.raises(AliyunError) as caught:
            sig.check_content_md5(headers["content-md5"], body + b" ")
        assert caught.value.kind is errors.INVALID_DIGEST
    with pytest.raises(AliyunError) as caught:
        sig.verify(request_["method"], headers, request_["url"] + "&x=1", lookup, now)
    assert caught.value.kind is errors.SIGNATURE_DOES_NOT_MATCH


def test_content_md5_in_both_forms_or_none() -> None:
    body = b"<Message/>"
    raw = base64.b64encode(hashlib.md5(body).digest()).decode()
    hexed = base64.b64encode(hashlib.md5(body).hexdigest().encode()).decode()
    for value in (raw, hexed, None, ""):
        sig.check_content_md5(value, body)
    with pytest.raises(AliyunError) as caught:
        sig.check_content_md5(raw, b"other")
    assert (caught.value.code, caught.value.http_status) == ("InvalidDigest", 400)
