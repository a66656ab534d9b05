"""The MD5 digests SQS answers with each sent and received message, computed as AWS does.

SDKs check them against what they sent (the Java SDK v1 and v2, the JS SDK's
middleware-sdk-sqs, .NET), so a digest that differs by one byte fails every send.

- the body: MD5 of its UTF-8 bytes, in lowercase hex;
- the message attributes (and, alike, the message system attributes): the attributes sorted by
  name (by code point, as Java's String order does for the names SQS allows); for each, its
  name, its data type and its value, each as a 4-byte big-endian length and the bytes, with a
  transport byte between type and value: 1 for a string value (types String and Number), 2 for
  binary, 3 and 4 for string and binary lists (each item length-prefixed). No attributes: no digest.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import struct
from collections.abc import Callable, Mapping
from typing import Any, Final

STRING_TRANSPORT: Final = 1
BINARY_TRANSPORT: Final = 2
STRING_LIST_TRANSPORT: Final = 3
BINARY_LIST_TRANSPORT: Final = 4


def _md5_maker() -> Callable[..., Any]:
    """CPython's own MD5 when it is built in (a digest of a few hundred bytes costs less there
    than through an OpenSSL context), else hashlib's; the same digests either way."""
    try:
        maker: Callable[..., Any] = importlib.import_module("_md5").md5
    except (ImportError, AttributeError):
        return functools.partial(hashlib.md5, usedforsecurity=False)
    return maker


_new_md5: Final = _md5_maker()


def md5_of_body(body: str) -> str:
    digest: str = _new_md5(body.encode("utf-8")).hexdigest()
    return digest


def md5_of_message_attributes(attrs: Mapping[str, Mapping[str, Any]] | None) -> str | None:
    """The digest of message attributes in the normalized shape: name → {"DataType",
    "StringValue" | "BinaryValue" | "StringListValues" | "BinaryListValues"}; None when empty."""
    if not attrs:
        return None
    digest = _new_md5()
    for name in sorted(attrs):
        value = attrs[name]
        _put(digest, name.encode("utf-8"))
        _put(digest, str(value.get("DataType", "")).encode("utf-8"))
        if value.get("StringValue") is not None:
            digest.update(bytes([STRING_TRANSPORT]))
            _put(digest, str(value["StringValue"]).encode("utf-8"))
        elif value.get("BinaryValue") is not None:
            digest.update(bytes([BINARY_TRANSPORT]))
            _put(digest, bytes(value["BinaryValue"]))
        elif value.get("StringListValues"):
            digest.update(bytes([STRING_LIST_TRANSPORT]))
            for item in value["StringListValues"]:
                _put(digest, str(item).encode("utf-8"))
        elif value.get("BinaryListValues"):
            digest.update(bytes([BINARY_LIST_TRANSPORT]))
            for item in value["BinaryListValues"]:
                _put(digest, bytes(item))
    found: str = digest.hexdigest()
    return found


def md5_of_message_system_attributes(attrs: Mapping[str, Mapping[str, Any]] | None) -> str | None:
    """The same digest over the message system attributes a sender set (`AWSTraceHeader`)."""
    return md5_of_message_attributes(attrs)


def _put(digest: Any, data: bytes) -> None:
    digest.update(struct.pack(">I", len(data)))
    digest.update(data)
