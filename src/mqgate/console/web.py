"""What the console adds to the web layer (mqgate.web): requests with forms and cookies, and
HTML, redirect and download answers."""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Final
from urllib.parse import parse_qs, quote

from mqgate.errors import BadRequest
from mqgate.web.asgi import Receive, Scope, Send, headers_of, read_body

MAX_FORM_BYTES: Final = 1024 * 1024
# Every page: no framing by other sites, no sniffing, scripts and styles from this origin only.
SECURITY_HEADERS: Final = [
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
    ),
    (b"cache-control", b"no-store"),
]


@dataclass(slots=True)
class WebRequest:
    method: str
    path: str  # below the console's mount point, starting with "/"
    query: dict[str, list[str]]
    headers: dict[bytes, bytes]
    client_ip: str  # the peer, or the client behind a trusted proxy (client_address)
    secure: bool  # served over TLS: cookies get Secure
    form: dict[str, list[str]] = field(default_factory=dict)

    @property
    def cookies(self) -> dict[str, str]:
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(self.headers.get(b"cookie", b"").decode("latin-1"))
        except Exception:  # a malformed Cookie header: as if there were none
            return {}
        return {k: m.value for k, m in jar.items()}

    def arg(self, name: str, default: str = "") -> str:
        """A field of the form, else of the query string."""
        values = self.form.get(name) or self.query.get(name)
        return values[0].strip() if values else default

    def args(self, name: str) -> list[str]:
        return self.form.get(name) or self.query.get(name) or []

    def int_arg(self, name: str, default: int | None = None) -> int | None:
        raw = self.arg(name)
        if not raw:
            return default
        try:
            return int(raw)
        except ValueError:
            raise BadRequest(f"{name} must be a whole number", field=name) from None

    def float_arg(self, name: str, default: float | None = None) -> float | None:
        raw = self.arg(name)
        if not raw:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise BadRequest(f"{name} must be a number", field=name) from None
        if not math.isfinite(value):  # inf and nan parse, then break every sum they enter
            raise BadRequest(f"{name} must be a finite number", field=name)
        return value


@dataclass(slots=True)
class WebResponse:
    body: bytes = b""
    status: int = 200
    content_type: bytes = b"text/html; charset=utf-8"
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    def set_cookie(
        self, name: str, value: str, *, path: str, secure: bool, max_age_s: int | None = None
    ) -> None:
        parts = [f"{name}={value}", f"Path={path}", "HttpOnly", "SameSite=Lax"]
        if max_age_s is not None:
            parts.append(f"Max-Age={max_age_s}")
        if secure:
            parts.append("Secure")
        self.headers.append((b"set-cookie", "; ".join(parts).encode()))


def redirect(location: str) -> WebResponse:
    """After a form post: 303 so the browser fetches the next page with GET."""
    return WebResponse(status=303, headers=[(b"location", quote(location, safe="/?=&%:#.-_~+").encode())])


def download(body: bytes, filename: str, content_type: str) -> WebResponse:
    disposition = f'attachment; filename="{filename}"'.encode()
    return WebResponse(body, 200, content_type.encode(), [(b"content-disposition", disposition)])


Networks = tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]


def trusted_networks(setting: str) -> Networks:
    """The `console_trusted_proxies` setting: addresses and CIDR blocks, comma-separated."""
    try:
        return tuple(
            ipaddress.ip_network(part.strip(), strict=False) for part in setting.split(",") if part.strip()
        )
    except ValueError as exc:
        raise BadRequest(f"console_trusted_proxies: {exc}", field="console_trusted_proxies") from None


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    # A dual-stack socket names an IPv4 peer ::ffff:a.b.c.d: compare it as the IPv4 address.
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return mapped or address


def client_address(peer: str, forwarded_for: str, trusted: Networks) -> str:
    """Who sent the request: the peer, unless it is a trusted proxy. Then X-Forwarded-For is
    read from the right (each proxy appends the address it was called from) up to the first
    address that is not a trusted proxy; what stands left of it the client may have made up."""
    client = _address(peer)
    if client is None or not any(client in net for net in trusted):
        return peer
    for hop in reversed(forwarded_for.split(",")):
        address = _address(hop)
        if address is None:  # not an address: the last one a trusted proxy vouched for stands
            break
        client = address
        if not any(address in net for net in trusted):
            break
    return str(client)


async def read_request(
    scope: Scope, receive: Receive, mount: str, trusted_proxies: Networks = ()
) -> WebRequest:
    headers = headers_of(scope)
    client = scope.get("client")
    # Every X-Forwarded-For line, in order (a proxy may add a line of its own instead of appending).
    forwarded_for = b",".join(value for name, value in scope["headers"] if name == b"x-forwarded-for")
    request = WebRequest(
        scope["method"],
        scope["path"][len(mount) :] or "/",
        parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True),
        headers,
        client_address(client[0] if client else "", forwarded_for.decode("latin-1"), trusted_proxies),
        scope.get("scheme") == "https",
    )
    if request.method == "POST":
        body = await read_body(receive, headers, MAX_FORM_BYTES, "the form")
        kind = headers.get(b"content-type", b"").split(b";")[0].strip()
        if body and kind != b"application/x-www-form-urlencoded":
            raise BadRequest("forms are sent as application/x-www-form-urlencoded", field="body")
        request.form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return request


# A generated report (mqgate analytics): its own inline styles and embedded plots, no script.
REPORT_CSP: Final = b"default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'"


async def send_response(send: Send, response: WebResponse) -> None:
    own = {name for name, _ in response.headers}
    kept = [(name, value) for name, value in SECURITY_HEADERS if name not in own]
    headers = [(b"content-type", response.content_type), *kept, *response.headers]
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})
