"""Whether a request is for the SQS API, asked of every request the gateway serves: from its
method, path and headers alone, without loading the SQS edge (its protocol, service and answers
load at its first request, `mqgate.app`)."""

from __future__ import annotations

import re
from typing import Final

from mqgate.web.asgi import Scope

JSON_TARGET_PREFIX: Final = "AmazonSQS."  # the JSON protocol's X-Amz-Target: this, then the action
SIGV4_ALGORITHM: Final = "AWS4-HMAC-SHA256"
QUEUE_PATH: Final = re.compile(r"/\d{12}/[^/]{1,128}")
FORM_TYPE: Final = b"application/x-www-form-urlencoded"
_TARGET_PREFIX_BYTES: Final = JSON_TARGET_PREFIX.encode()
_ALGORITHM_BYTES: Final = SIGV4_ALGORITHM.encode()


def is_sqs_request(scope: Scope) -> bool:
    """Whether a request is for the SQS API, from its method, path and headers alone (the body
    is the edge's to read): a POST to `/` or to a queue URL's path that names an SQS action,
    is signed the AWS way, or is a form (the query protocol)."""
    if scope.get("method") != "POST":
        return False
    path: str = scope.get("path", "")
    if path != "/" and not QUEUE_PATH.fullmatch(path):
        return False
    for name, value in scope.get("headers", ()):
        if name == b"x-amz-target" and value.startswith(_TARGET_PREFIX_BYTES):
            return True
        if name == b"authorization" and value.startswith(_ALGORITHM_BYTES):
            return True
        if name == b"content-type" and value.lower().startswith(FORM_TYPE):
            return True
    return False
