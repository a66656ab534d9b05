"""SigV4 verification against botocore's own signer: requests as boto3 and the AWS CLI sign them
(the JSON protocol and the query protocol, unicode and spaces in the query and the body, a
presigned URL) verify; each way a request can be wrong fails with AWS's code and status. The
signing time is fixed and `now` passed explicitly: no wall clock."""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import botocore.auth
import pytest
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from mqgate.sqs import sigv4
from mqgate.sqs.sigv4 import (
    IncompleteSignature,
    InvalidClientTokenId,
    MissingAuthenticationToken,
    SignatureDoesNotMatch,
    SigV4Error,
)

KEY_ID = "MQGA" + "ABCDEFGHIJKLMNOP"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
SIGNED_AT = datetime.datetime(2025, 3, 4, 5, 6, 7, tzinfo=datetime.UTC)
NOW = SIGNED_AT.timestamp()
ENDPOINT = "http://127.0.0.1:8080"
MINUTE = 60


@dataclass
class Sent:
    """A signed request as the gateway receives it."""

    method: str
    path: str
    query: bytes
    headers: dict[bytes, bytes]
    body: bytes

    def verify(self, now: float = NOW, secrets: dict[str, str] | None = None) -> sigv4.Verified:
        known = {KEY_ID: SECRET} if secrets is None else secrets
        return sigv4.verify(self.method, self.path, self.query, self.headers, self.body, known.get, now)


@pytest.fixture(autouse=True)
def fixed_signing_time(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: SIGNED_AT.replace(tzinfo=None))
    yield


def sent(request: AWSRequest, host: str) -> Sent:
    prepared = request.prepare()
    url = urlsplit(prepared.url)
    headers = {
        k.lower().encode(): v.encode() if isinstance(v, str) else v for k, v in prepared.headers.items()
    }
    headers[b"host"] = host.encode()  # what the HTTP client adds, and botocore signed
    body = prepared.body or b""
    return Sent(
        prepared.method,
        url.path,
        url.query.encode(),
        headers,
        body if isinstance(body, bytes) else body.encode(),
    )


def sign(
    method: str = "POST",
    url: str = ENDPOINT + "/",
    *,
    data: bytes | str = b"",
    headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
    key_id: str = KEY_ID,
    secret: str = SECRET,
    region: str = "us-east-1",
    service: str = "sqs",
) -> Sent:
    request = AWSRequest(method=method, url=url, data=data, headers=headers or {}, params=params or {})
    botocore.auth.SigV4Auth(Credentials(key_id, secret), service, region).add_auth(request)
    return sent(request, urlsplit(url).netloc)


def json_request(
    body: dict[str, Any] | None = None, headers: dict[str, str] | None = None, **kwargs: Any
) -> Sent:
    return sign(
        data=json.dumps(body or {"QueueNamePrefix": "commandes été 🚀"}, ensure_ascii=False).encode(),
        headers={
            "X-Amz-Target": "AmazonSQS.ListQueues",
            "Content-Type": "application/x-amz-json-1.0",
            **(headers or {}),
        },
        **kwargs,
    )


def query_request(**kwargs: Any) -> Sent:
    form = "Action=ListQueues&Version=2012-11-05&QueueNamePrefix=commandes%20%C3%A9t%C3%A9%20%2B%20x"
    return sign(
        data=form, headers={"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}, **kwargs
    )


def expect(error: type[SigV4Error], status: int, sent_request: Sent, **kwargs: Any) -> SigV4Error:
    with pytest.raises(error) as caught:
        sent_request.verify(**kwargs)
    assert caught.value.http_status == status and caught.value.code == error.__name__
    return caught.value


# --- what verifies ----------------------------------------------------------------------


def test_json_protocol_request_with_unicode_body_verifies() -> None:
    request = json_request()
    assert "é" in request.body.decode()
    verified = request.verify()
    assert verified.access_key_id == KEY_ID and verified.region == "us-east-1"
    assert verified.signed_at == int(NOW) and not verified.presigned
    assert "x-amz-target" in verified.signed_headers and "host" in verified.signed_headers


def test_query_protocol_form_body_verifies_in_any_region() -> None:
    assert query_request(region="eu-west-3").verify().region == "eu-west-3"


def test_unicode_and_spaces_in_the_query_string_verify() -> None:
    # botocore signs `params` with %20 and sends spaces as '+'; a URL's own query as it is.
    with_params = sign(
        "GET", ENDPOINT + "/123456789012/orders", params={"Action": "ListQueues", "a b": "ü + / ~é"}
    )
    assert b"+" in with_params.query
    with_params.verify()
    in_url = sign("GET", ENDPOINT + "/123456789012/orders?x=%E2%9C%93&a=b%20c&empty=&e=2&e=1")
    in_url.verify()


def test_path_with_dot_segments_and_escapes_verifies() -> None:
    sign("GET", ENDPOINT + "/123456789012/a%20queue/./x/../orders").verify()


def test_at_exactly_fifteen_minutes_either_way_it_still_verifies() -> None:
    request = json_request()
    request.verify(now=NOW + 15 * MINUTE)
    request.verify(now=NOW - 15 * MINUTE)


def test_the_date_header_stands_in_for_x_amz_date() -> None:
    request = json_request(headers={"Date": "Tue, 04 Mar 2025 05:06:07 GMT"})
    assert b"x-amz-date" not in request.headers and b"date" in request.headers
    assert request.verify().signed_at == int(NOW)


def test_signing_keys_are_derived_once_per_secret_day_and_region() -> None:
    sigv4.signing_key.cache_clear()
    for _ in range(3):
        json_request().verify()
    info = sigv4.signing_key.cache_info()
    assert info.misses == 1 and info.hits == 2


def test_the_access_key_id_is_read_without_verifying() -> None:
    request = json_request()
    assert sigv4.access_key_id_of(request.headers, request.query) == KEY_ID
    assert sigv4.access_key_id_of({}, b"") is None
    assert sigv4.access_key_id_of({b"authorization": b"Bearer x"}, b"") is None


# --- presigned URLs ---------------------------------------------------------------------


def presigned(expires: int = 300, **params: str) -> Sent:
    request = AWSRequest(
        method="GET", url=ENDPOINT + "/123456789012/orders", params=params or {"Action": "GetQueueAttributes"}
    )
    botocore.auth.SigV4QueryAuth(Credentials(KEY_ID, SECRET), "sqs", "us-east-1", expires=expires).add_auth(
        request
    )
    return sent(request, "127.0.0.1:8080")


def test_a_presigned_url_verifies_until_it_expires() -> None:
    url = presigned(300, Action="GetQueueAttributes", AttributeName="Tout à fait")
    assert b"X-Amz-Signature=" in url.query and b"authorization" not in url.headers
    assert sigv4.access_key_id_of(url.headers, url.query) == KEY_ID
    assert url.verify(now=NOW + 300).presigned
    error = expect(SignatureDoesNotMatch, 403, url, now=NOW + 301)
    assert error.message.startswith("Signature expired: ")


def test_a_tampered_presigned_url_fails() -> None:
    url = presigned()
    url.query = url.query.replace(b"GetQueueAttributes", b"DeleteQueue")
    expect(SignatureDoesNotMatch, 403, url)
    url = presigned()
    url.query = url.query.replace(b"X-Amz-Expires=300", b"X-Amz-Expires=9999999")
    expect(IncompleteSignature, 400, url)


# --- what fails, with AWS's codes -------------------------------------------------------


def test_no_signature_at_all_is_missing_authentication_token() -> None:
    request = json_request()
    del request.headers[b"authorization"]
    error = expect(MissingAuthenticationToken, 403, request)
    assert error.message == "Request is missing Authentication Token"


def test_a_flipped_signature_byte_does_not_match() -> None:
    request = json_request()
    auth = request.headers[b"authorization"]
    last = auth[-1:]
    request.headers[b"authorization"] = auth[:-1] + (b"0" if last != b"0" else b"1")
    error = expect(SignatureDoesNotMatch, 403, request)
    assert error.message.startswith("The request signature we calculated does not match")


def test_a_wrong_secret_does_not_match() -> None:
    expect(SignatureDoesNotMatch, 403, json_request(secret="x" * 40))


def test_an_unknown_or_revoked_key_is_an_invalid_client_token_id() -> None:
    error = expect(InvalidClientTokenId, 403, json_request(key_id="MQGAZZZZZZZZZZZZZZZZ"))
    assert error.message == "The security token included in the request is invalid."
    expect(InvalidClientTokenId, 403, json_request(), secrets={})  # revoked: the lookup has none


def test_sixteen_minutes_off_either_way_is_a_signature_expired_or_not_yet_current() -> None:
    request = json_request()
    late = expect(SignatureDoesNotMatch, 403, request, now=NOW + 16 * MINUTE)
    assert late.message == (
        "Signature expired: 20250304T050607Z is now earlier than 20250304T050707Z "
        "(20250304T052207Z - 15 min.)"
    )
    early = expect(SignatureDoesNotMatch, 403, request, now=NOW - 16 * MINUTE)
    assert early.message.startswith("Signature not yet current: 20250304T050607Z is still later than")


def test_a_tampered_body_does_not_match() -> None:
    request = query_request()
    request.body = request.body.replace(b"ListQueues", b"DeleteQueue")
    expect(SignatureDoesNotMatch, 403, request)


def test_a_content_hash_that_is_not_the_bodys_does_not_match() -> None:
    request = json_request(headers={"X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"})
    expect(SignatureDoesNotMatch, 403, request)
    signed_hash = json_request(headers={"X-Amz-Content-SHA256": "0" * 64})
    expect(SignatureDoesNotMatch, 403, signed_hash)


def test_a_missing_signed_header_does_not_match() -> None:
    request = json_request()
    del request.headers[b"x-amz-target"]
    error = expect(SignatureDoesNotMatch, 403, request)
    assert "'x-amz-target'" in error.message and error.field == "x-amz-target"


def test_a_changed_signed_header_does_not_match_but_whitespace_does_not_count() -> None:
    request = json_request()
    request.headers[b"x-amz-target"] = b"AmazonSQS.DeleteQueue"
    expect(SignatureDoesNotMatch, 403, request)
    spaced = json_request()
    spaced.headers[b"x-amz-target"] = b"  AmazonSQS.ListQueues "
    spaced.verify()


def test_another_service_in_the_scope_does_not_match() -> None:
    error = expect(SignatureDoesNotMatch, 403, json_request(service="sns"))
    assert error.message == "Credential should be scoped to correct service: 'sqs'."


@pytest.mark.parametrize(
    ("authorization", "says"),
    [
        ("Bearer mqp_token", "Authorization header requires 'Credential' parameter."),
        ("AWS4-HMAC-SHA256 SignedHeaders=host;x-amz-date, Signature=00", "requires 'Credential' parameter"),
        ("AWS4-HMAC-SHA256 Credential=MQGA/20250304/us-east-1/sqs, SignedHeaders=host, Signature=0",
         "Credential must have exactly 5 slash-delimited elements"),
        ("AWS4-HMAC-SHA256 Credential=K/20250304/us-east-1/sqs/aws4_request, SignedHeaders=x-amz-date, "
         "Signature=0", "'Host' must be a 'SignedHeader'"),
        ("AWS4-ECDSA-P256-SHA256 Credential=K/20250304/sqs/aws4_request", "Unsupported AWS 'algorithm'"),
    ],
)  # fmt: skip
def test_a_malformed_authorization_header_is_an_incomplete_signature(authorization: str, says: str) -> None:
    request = json_request()
    request.headers[b"authorization"] = authorization.encode()
    error = expect(IncompleteSignature, 400, request)
    assert says in error.message


def test_no_request_date_is_an_incomplete_signature() -> None:
    request = json_request()
    del request.headers[b"x-amz-date"]
    error = expect(IncompleteSignature, 400, request)
    assert "requires existence of either a 'X-Amz-Date' or a 'Date' header" in error.message


def test_a_scope_of_another_day_does_not_match() -> None:
    request = json_request()
    request.headers[b"x-amz-date"] = b"20250305T000000Z"
    error = expect(SignatureDoesNotMatch, 403, request, now=NOW + 12 * 3600)
    assert error.message.startswith("Date in Credential scope does not match")
