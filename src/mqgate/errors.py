"""One exception root for the whole system.

Every error carries the HTTP status it maps to, a machine-readable code and, where a request
field is at fault, that field's name. The gateway has a single handler that turns any
`MqgateError` into the JSON envelope; backends translate their own exceptions into these.
"""

from __future__ import annotations


class MqgateError(Exception):
    http_status: int = 500
    code: str = "internal"
    # Sent as Retry-After (rounded up to whole seconds) when set: the call may succeed later.
    retry_after_s: float | None = None

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if code is not None:
            self.code = code


class BadRequest(MqgateError):
    http_status = 400
    code = "bad_request"


class Unauthorized(MqgateError):
    http_status = 401
    code = "unauthorized"


class Forbidden(MqgateError):
    http_status = 403
    code = "forbidden"


class NotFound(MqgateError):
    http_status = 404
    code = "not_found"


class MethodNotAllowed(MqgateError):
    http_status = 405
    code = "method_not_allowed"


class Conflict(MqgateError):
    """An ack, release or extend that no longer matches the lock (reason in `code`)."""

    http_status = 409
    code = "conflict"


class AlreadyExists(MqgateError):
    http_status = 409
    code = "already_exists"


class PayloadTooLarge(MqgateError):
    http_status = 413
    code = "too_large"


class UnsupportedMediaType(MqgateError):
    http_status = 415
    code = "unsupported_media_type"


class Unavailable(MqgateError):
    """A server the gateway depends on (Redis, the registry database) cannot be reached."""

    http_status = 503
    code = "unavailable"
    retry_after_s = 1.0


class StorageError(MqgateError):
    """The durable store failed (disk full, I/O error); the request was not accepted."""

    http_status = 503
    code = "storage"


# A topic whose store files cannot be read (its topic.json): not served, the others are.
TOPIC_DAMAGED = "topic_damaged"


class InsufficientStorage(MqgateError):
    """The disk is full, or below the free-space floor: nothing was stored; retry once space
    is freed (the gateway resumes by itself)."""

    http_status = 507
    code = "disk_full"
    retry_after_s = 5.0


class TooManyRequests(MqgateError):
    """More requests of a kind at once than the gateway takes (a role's budget)."""

    http_status = 429
    code = "too_many_requests"
    retry_after_s = 1.0


class CorruptRecord(MqgateError):
    code = "corrupt_record"
