"""One request, as every door sees it: the API, the console and the compatibility edges.

What the router and the door's guard found is kept on it: the path parameters, who holds the
credential (found before the body is read), the decoded input, and who is calling.
"""

from __future__ import annotations

import ipaddress
import math
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs

import msgspec

from mqgate.errors import BadRequest


class Request(msgspec.Struct):
    method: str
    path: str  # below the door's mount point, starting with "/"
    headers: dict[bytes, bytes]
    client_host: str  # the peer, or the client behind a trusted proxy (client_address)
    query_string: bytes = b""
    secure: bool = False  # served over TLS: cookies get Secure
    params: dict[str, str] = msgspec.field(default_factory=dict)  # the path's "{name}" segments
    form: dict[str, list[str]] = msgspec.field(default_factory=dict)  # a form body, decoded
    credential: Any = None  # who holds the credential, as the door's guard found it
    input: Any = None  # the route's request shape, decoded and checked
    caller: Any = None  # who is calling, as the guard found it once the input was decoded
    _query: dict[str, list[str]] | None = None

    @property
    def bearer(self) -> str | None:
        value = self.headers.get(b"authorization", b"").decode("latin-1")
        if value[:7].lower() == "bearer ":
            return value[7:].strip() or None
        return None

    @property
    def query(self) -> dict[str, list[str]]:
        if self._query is None:
            self._query = parse_qs(self.query_string.decode("latin-1"), keep_blank_values=True)
        return self._query

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


Networks = tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]


def trusted_networks(setting: str, name: str = "console_trusted_proxies") -> Networks:
    """A trusted-proxies setting: addresses and CIDR blocks, comma-separated."""
    try:
        return tuple(
            ipaddress.ip_network(part.strip(), strict=False) for part in setting.split(",") if part.strip()
        )
    except ValueError as exc:
        raise BadRequest(f"{name}: {exc}", field=name) from None


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
