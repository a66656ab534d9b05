"""The errors of the SQS-compatible API, with the codes, statuses and fault sides AWS SQS answers.

An SQS error has two names because SQS speaks two protocols. The AWS JSON 1.0 protocol names it
by its shape (`QueueDoesNotExist`, sent as `__type` with its namespace), the query protocol by its
legacy code (`AWS.SimpleQueueService.NonExistentQueue`, sent as `<Code>`). A JSON answer carries
the legacy code too, in the `x-amzn-query-error: <code>;<Sender|Receiver>` header: SQS's model has
the `awsQueryCompatible` trait, and SDKs (botocore, JS v3, Java v2) surface that code to callers
whose code was written against the query protocol.

Where each name, status and side comes from:

- the SQS operations' modeled errors: their shape names in botocore 1.44's service model
  (`botocore/data/sqs/2012-11-05/service-2.json`), their query codes and statuses in the last
  query-protocol model (botocore 1.34's, the `error` traits) and in the `awsQueryError` traits;
- errors common to every action (`InvalidAction`, `MissingParameter`, `InvalidParameterValue`,
  the signature and credential errors, `InternalFailure`…): the SQS API Reference's "Common
  Errors" page; in JSON they are Coral's (`com.amazon.coral.service#…`) shapes.
"""

from __future__ import annotations

from typing import Final

import msgspec

from mqgate.errors import MqgateError

SQS_NAMESPACE: Final = "com.amazonaws.sqs"
COMMON_NAMESPACE: Final = "com.amazon.coral.service"


class ErrorKind(msgspec.Struct, frozen=True):
    """One error as AWS SQS answers it in both protocols."""

    code: str  # the JSON protocol's name (the shape), e.g. "QueueDoesNotExist"
    query_code: str  # the query protocol's <Code> and the x-amzn-query-error code
    http_status: int
    sender_fault: bool = True
    namespace: str = SQS_NAMESPACE
    # False where SQS sends no x-amzn-query-error: the SDK then reports the JSON name as it is.
    query_header: bool = True

    @property
    def json_type(self) -> str:
        return f"{self.namespace}#{self.code}"


def _sqs(code: str, query_code: str, status: int = 400) -> ErrorKind:
    return ErrorKind(code, query_code, status)


def _common(code: str, query_code: str, status: int, *, sender: bool = True) -> ErrorKind:
    return ErrorKind(code, query_code, status, sender, COMMON_NAMESPACE)


# The modeled errors of the SQS operations.
QUEUE_DOES_NOT_EXIST: Final = _sqs("QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue")
QUEUE_NAME_EXISTS: Final = _sqs("QueueNameExists", "QueueAlreadyExists")
QUEUE_DELETED_RECENTLY: Final = _sqs("QueueDeletedRecently", "AWS.SimpleQueueService.QueueDeletedRecently")
MESSAGE_NOT_INFLIGHT: Final = _sqs("MessageNotInflight", "AWS.SimpleQueueService.MessageNotInflight")
RECEIPT_HANDLE_IS_INVALID: Final = _sqs("ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid")
INVALID_ID_FORMAT: Final = _sqs("InvalidIdFormat", "InvalidIdFormat")
INVALID_ATTRIBUTE_NAME: Final = _sqs("InvalidAttributeName", "InvalidAttributeName")
INVALID_ATTRIBUTE_VALUE: Final = _sqs("InvalidAttributeValue", "InvalidAttributeValue")
INVALID_MESSAGE_CONTENTS: Final = _sqs("InvalidMessageContents", "InvalidMessageContents")
UNSUPPORTED_OPERATION: Final = _sqs("UnsupportedOperation", "AWS.SimpleQueueService.UnsupportedOperation")
OVER_LIMIT: Final = _sqs("OverLimit", "OverLimit", 403)
PURGE_QUEUE_IN_PROGRESS: Final = _sqs(
    "PurgeQueueInProgress", "AWS.SimpleQueueService.PurgeQueueInProgress", 403
)
TOO_MANY_ENTRIES: Final = _sqs(
    "TooManyEntriesInBatchRequest", "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"
)
EMPTY_BATCH_REQUEST: Final = _sqs("EmptyBatchRequest", "AWS.SimpleQueueService.EmptyBatchRequest")
BATCH_ENTRY_IDS_NOT_DISTINCT: Final = _sqs(
    "BatchEntryIdsNotDistinct", "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"
)
INVALID_BATCH_ENTRY_ID: Final = _sqs("InvalidBatchEntryId", "AWS.SimpleQueueService.InvalidBatchEntryId")
BATCH_REQUEST_TOO_LONG: Final = _sqs("BatchRequestTooLong", "AWS.SimpleQueueService.BatchRequestTooLong")
REQUEST_THROTTLED: Final = _sqs("RequestThrottled", "RequestThrottled")
INVALID_ADDRESS: Final = _sqs("InvalidAddress", "InvalidAddress", 404)
INVALID_SECURITY: Final = _sqs("InvalidSecurity", "InvalidSecurity", 403)
RESOURCE_NOT_FOUND: Final = _sqs("ResourceNotFoundException", "ResourceNotFoundException", 404)

# The errors common to all actions ("Common Errors" of the SQS API Reference).
INVALID_ACTION: Final = ErrorKind(
    "UnknownOperationException", "InvalidAction", 400, True, COMMON_NAMESPACE, query_header=False
)
MISSING_ACTION: Final = _common("MissingAction", "MissingAction", 400)
MISSING_PARAMETER: Final = _common("MissingRequiredParameterException", "MissingParameter", 400)
INVALID_PARAMETER_VALUE: Final = _common("InvalidParameterValueException", "InvalidParameterValue", 400)
# A JSON body that is not JSON, or a member of the wrong JSON type: Coral's own refusal.
SERIALIZATION: Final = ErrorKind(
    "SerializationException", "SerializationException", 400, True, COMMON_NAMESPACE, query_header=False
)
ACCESS_DENIED: Final = _common("AccessDeniedException", "AccessDenied", 403)
INTERNAL_ERROR: Final = _common("InternalFailure", "InternalError", 500, sender=False)
SERVICE_UNAVAILABLE: Final = _common("ServiceUnavailable", "ServiceUnavailable", 503, sender=False)
INVALID_CLIENT_TOKEN_ID: Final = _common("InvalidClientTokenId", "InvalidClientTokenId", 403)
SIGNATURE_DOES_NOT_MATCH: Final = _common("SignatureDoesNotMatch", "SignatureDoesNotMatch", 403)
MISSING_AUTHENTICATION_TOKEN: Final = _common(
    "MissingAuthenticationTokenException", "MissingAuthenticationToken", 403
)
INCOMPLETE_SIGNATURE: Final = _common("IncompleteSignatureException", "IncompleteSignature", 400)
REQUEST_EXPIRED: Final = _common("RequestExpired", "RequestExpired", 400)

ALL_KINDS: Final[tuple[ErrorKind, ...]] = tuple(
    value for value in list(globals().values()) if isinstance(value, ErrorKind)
)
# By either name: the sigv4 module's errors and other MqgateErrors carry only a code.
_BY_CODE: Final[dict[str, ErrorKind]] = {
    **{kind.query_code: kind for kind in ALL_KINDS},
    **{kind.code: kind for kind in ALL_KINDS},
}


class SqsError(MqgateError):
    """An SQS refusal: `code` is the JSON protocol's name, `query_code` the query protocol's."""

    def __init__(self, kind: ErrorKind, message: str = "") -> None:
        super().__init__(message, code=kind.code)
        self.kind = kind
        self.http_status = kind.http_status
        self.query_code = kind.query_code
        self.sender_fault = kind.sender_fault

    def __repr__(self) -> str:
        return f"SqsError({self.kind.code}, {self.message!r})"


def kind_of(code: str) -> ErrorKind | None:
    """The error of that JSON name or query code, if it is one this module knows."""
    return _BY_CODE.get(code)


def as_sqs_error(exc: BaseException) -> SqsError:
    """Any error as the SQS refusal it answers: itself, an `MqgateError` whose code AWS knows
    (the SigV4 errors), a server that cannot be reached, or else an internal error that tells
    nothing of its cause."""
    if isinstance(exc, SqsError):
        return exc
    if isinstance(exc, MqgateError):
        kind = kind_of(exc.code)
        if kind is not None:
            return SqsError(kind, exc.message)
        if exc.http_status == 503:
            return SqsError(SERVICE_UNAVAILABLE, "Service is unavailable. Please try again later.")
    return SqsError(INTERNAL_ERROR, "We encountered an internal error. Please try again.")


# Messages as AWS SQS words them, so that clients matching on them behave alike.
def queue_does_not_exist() -> SqsError:
    return SqsError(QUEUE_DOES_NOT_EXIST, "The specified queue does not exist.")


def missing_parameter(name: str) -> SqsError:
    return SqsError(MISSING_PARAMETER, f"The request must contain the parameter {name}.")


def invalid_parameter_value(reason: str) -> SqsError:
    return SqsError(INVALID_PARAMETER_VALUE, reason)


def invalid_value_for(name: str, value: object, reason: str) -> SqsError:
    return SqsError(
        INVALID_PARAMETER_VALUE, f"Value {value} for parameter {name} is invalid. Reason: {reason}"
    )
