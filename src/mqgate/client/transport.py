"""Requests to one gateway on kept-alive http.client connections, safe to share by threads:
each request takes an idle connection of its own (or opens one) and puts it back once the
answer is read."""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode, urlsplit

from mqgate.client.failures import error_from_answer, is_transient, unreachable
from mqgate.errors import BadRequest, MqgateError


class Transport:
    """With `retry_for_s`, a call that finds the gateway unreachable or gets a transient status
    is tried again with backoff for that long, never before the answer's Retry-After."""

    def __init__(self, url: str, token: str, timeout_s: float, retry_for_s: float) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.retry_for_s = retry_for_s
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BadRequest(f"gateway URL {url!r} is not an http:// or https:// URL", field="url")
        self._https = parts.scheme == "https"
        self._host, self._port, self._base = parts.hostname, parts.port, parts.path
        self._auth = f"Bearer {token}"
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._ssl: ssl.SSLContext | None = None

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: bytes | None = None,
        what: str | None = None,
    ) -> bytes:
        """The raw body of a successful answer; an error answer or no answer raises."""
        what = what or f"{method} {path}"
        target = self._base + path + ("?" + urlencode(params) if params else "")
        deadline = time.monotonic() + self.retry_for_s
        delay = 0.1
        while True:
            try:
                status, data, retry_after = self._exchange(method, target, body, what)
                if status == 200:
                    return data
                raise error_from_answer(status, data, retry_after, what)
            except MqgateError as exc:
                # Retry-After is when the gateway expects the call to succeed (a 507 waits for
                # space to be freed): an attempt before it would only spend the budget.
                wait = max(delay, exc.retry_after_s or 0.0)
                if not is_transient(exc) or time.monotonic() + wait > deadline:
                    raise
            time.sleep(wait)
            delay = min(delay * 2, 2.0)

    def _connect(self) -> http.client.HTTPConnection:
        if not self._https:
            return http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s)
        if self._ssl is None:  # once per client: building one reads the CA bundle
            self._ssl = ssl.create_default_context()
        return http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout_s, context=self._ssl)

    def _exchange(
        self, method: str, target: str, body: bytes | None, what: str
    ) -> tuple[int, bytes, str | None]:
        """(status, body, Retry-After) of one request on an idle or new connection. A kept-alive
        connection the server closed meanwhile fails at once: then the request goes again on
        another (a timeout is not that, and is not repeated)."""
        headers = {"Authorization": self._auth, "User-Agent": "mqgate-cli"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            reused = conn is not None
            if conn is None:
                conn = self._connect()
            try:
                conn.request(method, target, body=body, headers=headers)
                r = conn.getresponse()
                data = r.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                if reused and not isinstance(exc, TimeoutError):
                    continue
                raise unreachable(what, self.url, exc) from exc
            if r.will_close:
                conn.close()
            else:
                with self._lock:
                    self._idle.append(conn)
            return r.status, data, r.getheader("Retry-After")
