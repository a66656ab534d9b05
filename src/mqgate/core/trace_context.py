"""A message's W3C trace context (SPEC P6; https://www.w3.org/TR/trace-context/). Pure: no IO.

A message keeps the `traceparent` its producer gave (the request's header, or a property of its
own) as the property `traceparent`. A message without one has a context derived from its id
(`derived_traceparent`): the same on every gateway, in every delivery and in every trace query,
and stored nowhere. Why not store a generated one: 71 bytes more in every traced message
(~250 bytes untraced) made a traced produce of a batch of 100 cost ~0.85 of an untraced one, in
the write, its checksum and its fsync (issue 11, benchmarks/RESULTS.md); the derived one costs
nothing at produce. Each such message is then a trace of its own (its path), which is also what
OpenTelemetry's messaging conventions give every message: its own creation context. A producer
that wants its messages in one trace sends a `traceparent`; they all keep it.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

import msgspec

TRACEPARENT: Final = "traceparent"  # the property and header that carries it
_TRACEPARENT_RE: Final = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_ZERO_TRACE: Final = "0" * 32
_ZERO_SPAN: Final = "0" * 16
# Domain separation: the derived ids are mqgate's, not any other use of a hash of the id.
_DERIVATION: Final = b"mqgate-trace"


class TraceParent(msgspec.Struct, frozen=True):
    trace_id: str  # 32 lowercase hex, not all zeros
    parent_id: str  # 16 lowercase hex, not all zeros
    flags: int = 1  # bit 0: sampled

    def header(self) -> str:
        return f"00-{self.trace_id}-{self.parent_id}-{self.flags:02x}"

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 1)


def parse_traceparent(value: str | None) -> TraceParent | None:
    """The traceparent a request carried, or None when it is absent or invalid (the spec says a
    receiver then starts a new trace). Version ff is invalid; a future version is read by its
    version-00 prefix, as the spec asks."""
    if not value:
        return None
    found = _TRACEPARENT_RE.fullmatch(value.strip().lower())
    if found is None:
        return None
    version, trace_id, parent_id, flags, rest = found.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == _ZERO_TRACE or parent_id == _ZERO_SPAN:
        return None
    return TraceParent(trace_id, parent_id, int(flags, 16))


def request_context(header: str | None) -> str | None:
    """The context a produce request's `traceparent` header gives its messages: the header as
    version 00 when it is valid, else None (its messages then get their derived ones)."""
    parsed = parse_traceparent(header)
    return None if parsed is None else parsed.header()


def derived_traceparent(msg_id: str) -> str:
    """The context of a message that has none of its own: trace and parent ids from a hash of
    its id (pseudo-random, as W3C asks of trace ids, so a sampler that reads their low bits
    samples evenly), sampled."""
    salt = b""
    while True:
        drawn = hashlib.blake2b(msg_id.encode() + salt, digest_size=24, person=_DERIVATION).hexdigest()
        trace, span = drawn[:32], drawn[32:]
        if trace != _ZERO_TRACE and span != _ZERO_SPAN:  # never in practice: 2^-64 per id
            return f"00-{trace}-{span}-01"
        salt += b"\0"


def context_of(msg_id: str, stored: str | None) -> str:
    """A message's context: the `traceparent` property it keeps when valid, else derived."""
    if stored and parse_traceparent(stored) is not None:
        return stored
    return derived_traceparent(msg_id)


def with_traceparent(properties: dict[str, str], context: str) -> dict[str, str]:
    """The message's properties with its W3C trace context: its own valid one (`properties`
    themselves), else `context` (SPEC P6: a user's OpenTelemetry spans join the same trace).
    At produce `context` is the request's (`request_context`: the messages of one request share
    its trace); at a traced delivery the message's derived one."""
    own = properties.get(TRACEPARENT)
    if own is not None and parse_traceparent(own) is not None:
        return properties
    return {**properties, TRACEPARENT: context}
