"""The errors of Alibaba Cloud MQ's HTTP API, with the codes, statuses and messages the service
answers (its "Error codes for the HTTP client SDK" page; the SDKs surface `Code` to callers and
branch on none but `MessageNotExist`, the normal answer of a consume that found nothing).

An error travels as `<Error><Code/><Message/><RequestId/><HostId/></Error>` (`xml.encode_error`)
with the kind's HTTP status; a partly failed ack as `<Errors>` with one `<Error>` per receipt
handle (`xml.encode_ack_errors`), status `ACK_PARTIAL_FAILURE_STATUS`.
"""

from __future__ import annotations

from typing import Final

import msgspec

from mqgate.errors import MqgateError


class ErrorKind(msgspec.Struct, frozen=True):
    """One error as the service answers it."""

    code: str  # the document's <Code>, e.g. "MessageNotExist"
    http_status: int
    message: str  # the service's own wording, used when the caller gives none


# Authentication and authorization.
ACCESS_DENIED: Final = ErrorKind(
    "AccessDenied", 403, "The OwnerId that your Access Key Id associated to is forbidden for this operation."
)
INVALID_ACCESS_KEY_ID: Final = ErrorKind(
    "InvalidAccessKeyId", 403, "The AccessKey Id you provided is not exist."
)
SIGNATURE_DOES_NOT_MATCH: Final = ErrorKind(
    "SignatureDoesNotMatch",
    403,
    "The request signature we calculated does not match the signature you provided. "
    "Check your key and signing method.",
)
# The request's Date is too far from the service's clock (MNS and MQ: 15 minutes).
TIME_EXPIRED: Final = ErrorKind("TimeExpired", 408, "The http request you sent is expired.")

# The request's form.
INVALID_AUTHORIZATION_HEADER: Final = ErrorKind(
    "InvalidAuthorizationHeader", 400, "The Authorization header format is invalid."
)
MISSING_AUTHORIZATION_HEADER: Final = ErrorKind(
    "MissingAuthorizationHeader", 400, "Authorization header is required."
)
INVALID_DATE_HEADER: Final = ErrorKind("InvalidDateHeader", 400, "The Date header format is invalid.")
MISSING_DATE_HEADER: Final = ErrorKind("MissingDateHeader", 400, "Date header is required.")
INVALID_DIGEST: Final = ErrorKind("InvalidDigest", 400, "The Content-MD5 you specified is invalid.")
INVALID_ARGUMENT: Final = ErrorKind(
    "InvalidArgument", 400, "The XML you provided did not validate against our published schema."
)
INVALID_REQUEST_URL: Final = ErrorKind("InvalidRequestURL", 400, "Http request URL format invalid.")
INVALID_QUERY_STRING: Final = ErrorKind(
    "InvalidQueryString", 400, "Http request URL contains invalid querystring item."
)
MALFORMED_XML: Final = ErrorKind("MalformedXML", 400, "The XML you provided was not well-formed.")
MISSING_RECEIPT_HANDLE: Final = ErrorKind("MissingReceiptHandle", 400, "ReceiptHandle is required.")
RECEIPT_HANDLE_ERROR: Final = ErrorKind(
    "ReceiptHandleError", 400, "The receipt handle you provide is not valid."
)

# The resources.
TOPIC_NOT_EXIST: Final = ErrorKind("TopicNotExist", 404, "The topic you provided is not exist.")
# A consume that found nothing (after its long poll), and an ack or a commit/rollback past the
# handle's NextConsumeTime (or TransCheckImmunityTime): not a failure for the SDKs' samples.
MESSAGE_NOT_EXIST: Final = ErrorKind("MessageNotExist", 404, "Message not exist.")

# The service.
QPS_LIMIT_EXCEEDED: Final = ErrorKind("QpsLimitExceeded", 400, "The qps limit is exceeded.")
INTERNAL_ERROR: Final = ErrorKind("InternalError", 500, "Internal error.")

# An ack (or commit/rollback) with some receipt handles refused answers `<Errors>` with this status
# (the service's; the Python SDK reads an error document only from a status of 400 or more).
ACK_PARTIAL_FAILURE_STATUS: Final = 404

ALL: Final = (
    ACCESS_DENIED,
    INVALID_ACCESS_KEY_ID,
    SIGNATURE_DOES_NOT_MATCH,
    TIME_EXPIRED,
    INVALID_AUTHORIZATION_HEADER,
    MISSING_AUTHORIZATION_HEADER,
    INVALID_DATE_HEADER,
    MISSING_DATE_HEADER,
    INVALID_DIGEST,
    INVALID_ARGUMENT,
    INVALID_REQUEST_URL,
    INVALID_QUERY_STRING,
    MALFORMED_XML,
    MISSING_RECEIPT_HANDLE,
    RECEIPT_HANDLE_ERROR,
    TOPIC_NOT_EXIST,
    MESSAGE_NOT_EXIST,
    QPS_LIMIT_EXCEEDED,
    INTERNAL_ERROR,
)
BY_CODE: Final = {kind.code: kind for kind in ALL}


class AliyunError(MqgateError):
    """A request the service refuses: `kind` is its error (code and status), `message` the
    `<Message>` to send and `element`, where one is at fault, the XML element or query parameter."""

    def __init__(self, kind: ErrorKind, message: str | None = None, *, element: str | None = None) -> None:
        super().__init__(message or kind.message, field=element, code=kind.code)
        self.kind = kind
        self.http_status = kind.http_status
        self.element = element
