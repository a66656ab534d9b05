"""Whether a request is for Alibaba Cloud MQ's HTTP API, asked of every request the gateway
serves: from its path and headers alone, without loading the Aliyun edge (its protocol, XML and
service load at its first request, `mqgate.app`)."""

from __future__ import annotations

import re
from typing import Final

from mqgate.web.asgi import Scope

PATH: Final = re.compile(r"/topics/([^/]{1,512})/messages")
_MQ_SCHEME: Final = b"MQ "


def is_aliyun_path(path: str) -> bool:
    return PATH.fullmatch(path) is not None


def is_aliyun_request(scope: Scope) -> bool:
    """Whether a request is for this API, from its path and headers alone: the path
    `/topics/{topic}/messages` with an `MQ` Authorization or an `x-mq-version` header."""
    path: str = scope.get("path", "")
    if not path.startswith("/topics/") or not is_aliyun_path(path):  # every native request asks
        return False
    for name, value in scope.get("headers", ()):
        if (name == b"authorization" and value.startswith(_MQ_SCHEME)) or name == b"x-mq-version":
            return True
    return False
