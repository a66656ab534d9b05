"""Push attempts over HTTP/1.1 on asyncio's streams: a POST to an address `endpoints.resolve`
allowed (the name is not resolved again here), TLS with the endpoint's name for https, the whole
attempt within its timeout. Connections are kept open between attempts (`Pool`, keep-alive) when
the answer allows it; only its status and `Retry-After` are read, its body drained and dropped. A
redirect is a failure like any non-2xx."""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import ssl
import time
from typing import Final

import msgspec

from mqgate.push.endpoints import Endpoint

MAX_ANSWER_HEAD_BYTES: Final = 64 * 1024
MAX_DRAINED_BODY_BYTES: Final = 1024 * 1024  # a longer answer's connection is closed instead
IDLE_KEEP_S: Final = 4.0  # under the usual servers' keep-alive timeouts (uvicorn's is 5 s)
MAX_IDLE_PER_ENDPOINT: Final = 256
USER_AGENT: Final = "mqgate-push/1"
_TLS: ssl.SSLContext | None = None


def _tls() -> ssl.SSLContext:
    global _TLS
    if _TLS is None:  # made on first use: a gateway without https endpoints never loads the CAs
        _TLS = ssl.create_default_context()
    return _TLS


class Answer(msgspec.Struct, frozen=True):
    status: int
    retry_after_s: float | None  # what the endpoint asked for with Retry-After, if it did


class AttemptFailed(Exception):
    """No answer: the reason as counted (`connection`, `timeout`, `tls`, `protocol`)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class _Reused(Exception):
    """A kept connection that the endpoint had closed before the request reached it."""


def _retry_after(value: str) -> float | None:
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


class _Connection(msgspec.Struct):
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    reused: bool = False
    idle_since: float = msgspec.field(default_factory=time.monotonic)

    def close(self) -> None:
        self.writer.close()


async def _connect(endpoint: Endpoint, addresses: list[str]) -> _Connection:
    last: OSError | None = None
    for address in addresses:
        try:
            reader, writer = await asyncio.open_connection(
                address,
                endpoint.port,
                ssl=_tls() if endpoint.https else None,
                server_hostname=endpoint.host if endpoint.https else None,
                limit=MAX_ANSWER_HEAD_BYTES,
            )
            return _Connection(reader, writer)
        except ssl.SSLError as exc:
            raise AttemptFailed("tls", str(exc)) from None
        except OSError as exc:
            last = exc
    raise AttemptFailed("connection", str(last) if last else "no address")


class Pool:
    """Open connections by endpoint and address, reused while the endpoint keeps them."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int, bool, tuple[str, ...]], list[_Connection]] = {}

    async def post(
        self, endpoint: Endpoint, addresses: list[str], body: bytes, headers: dict[str, str], timeout_s: float
    ) -> Answer:
        try:
            async with asyncio.timeout(timeout_s):
                try:
                    return await self._attempt(endpoint, addresses, body, headers, reuse=True)
                except _Reused:  # closed by the endpoint while idle: once more, on a new one
                    return await self._attempt(endpoint, addresses, body, headers, reuse=False)
        except TimeoutError:
            raise AttemptFailed("timeout", f"no answer within {timeout_s:g} s") from None

    def close(self) -> None:
        for kept in self._idle.values():
            for conn in kept:
                conn.close()
        self._idle.clear()

    def _take(self, key: tuple[str, int, bool, tuple[str, ...]]) -> _Connection | None:
        kept = self._idle.get(key)
        now = time.monotonic()
        while kept:
            conn = kept.pop()
            if now - conn.idle_since < IDLE_KEEP_S and not conn.reader.at_eof():
                conn.reused = True
                return conn
            conn.close()
        return None

    def _keep(self, key: tuple[str, int, bool, tuple[str, ...]], conn: _Connection) -> None:
        kept = self._idle.setdefault(key, [])
        if len(kept) >= MAX_IDLE_PER_ENDPOINT:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        kept.append(conn)

    async def _attempt(
        self, endpoint: Endpoint, addresses: list[str], body: bytes, headers: dict[str, str], *, reuse: bool
    ) -> Answer:
        key = (endpoint.host, endpoint.port, endpoint.https, tuple(addresses))
        conn = self._take(key) if reuse else None
        if conn is None:
            conn = await _connect(endpoint, addresses)
        keep = False
        try:
            head = [
                f"POST {endpoint.target} HTTP/1.1",
                f"Host: {endpoint.host_header}",
                f"User-Agent: {USER_AGENT}",
                f"Content-Length: {len(body)}",
                *(f"{name}: {value}" for name, value in headers.items()),
            ]
            conn.writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
            await conn.writer.drain()
            answer, keep = await _read_answer(conn)
            return answer
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            if conn.reused:  # no answer began: the endpoint had let this connection go
                raise _Reused from None
            if isinstance(exc, asyncio.IncompleteReadError):
                raise AttemptFailed("protocol", f"the answer ended early: {exc}") from None
            raise AttemptFailed("connection", str(exc)) from None
        except asyncio.LimitOverrunError as exc:
            raise AttemptFailed("protocol", f"the answer's head is too long: {exc}") from None
        except ssl.SSLError as exc:
            raise AttemptFailed("tls", str(exc)) from None
        except OSError as exc:
            raise AttemptFailed("connection", str(exc)) from None
        finally:
            if keep:
                self._keep(key, conn)
            else:
                conn.close()


async def _read_answer(conn: _Connection) -> tuple[Answer, bool]:
    """The answer's status and Retry-After, and whether the connection may carry another
    request (its body drained: a length or chunks within MAX_DRAINED_BODY_BYTES, no `close`)."""
    reader = conn.reader
    status_line = await reader.readuntil(b"\r\n")
    conn.reused = False  # the endpoint answered: a failure from here on is this attempt's
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise AttemptFailed("protocol", f"not an HTTP answer: {status_line[:80]!r}")
    status = int(parts[1])
    retry_after: float | None = None
    length: int | None = None
    chunked = False
    keep = parts[0].startswith(b"HTTP/1.1")
    seen = len(status_line)
    while True:
        line = await reader.readuntil(b"\r\n")
        seen += len(line)
        if seen > MAX_ANSWER_HEAD_BYTES:
            raise AttemptFailed("protocol", "the answer's head is too long")
        if line == b"\r\n":
            break
        name, _, value = line.decode("latin-1").partition(":")
        name = name.strip().lower()
        if name == "retry-after":
            retry_after = _retry_after(value)
        elif name == "content-length":
            text = value.strip()
            length = int(text) if text.isdigit() else None
            keep = keep and length is not None
        elif name == "transfer-encoding":
            chunked = value.strip().lower() == "chunked"
        elif name == "connection" and "close" in value.lower():
            keep = False
    answer = Answer(status, retry_after)
    if 100 <= status < 200 or status in (204, 304):
        return answer, keep and not chunked and (length or 0) == 0
    if chunked:
        return answer, keep and await _drain_chunks(reader)
    if length is None:
        return answer, False  # the body runs to the connection's end
    if length > MAX_DRAINED_BODY_BYTES:
        return answer, False
    await reader.readexactly(length)
    return answer, keep


async def _drain_chunks(reader: asyncio.StreamReader) -> bool:
    total = 0
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size_text = size_line.split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            return False
        if size == 0:
            break
        total += size
        if total > MAX_DRAINED_BODY_BYTES:
            return False
        await reader.readexactly(size + 2)
    while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
        pass
    return True


async def post(
    endpoint: Endpoint, addresses: list[str], body: bytes, headers: dict[str, str], timeout_s: float
) -> Answer:
    """One attempt on a connection of its own, closed after it (no pool)."""
    pool = Pool()
    try:
        return await pool.post(endpoint, addresses, body, headers, timeout_s)
    finally:
        with contextlib.suppress(Exception):
            pool.close()
