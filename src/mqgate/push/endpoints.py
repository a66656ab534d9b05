"""Where a push consumer's messages may go: an http or https URL whose host resolves only to
public addresses, unless the operator allows private ones (`push_allow_private_endpoints`), so
the push feature is no door into the gateway's own network (SSRF).

The addresses are checked where the connection is made: `client.py` connects to an address
`resolve` returned, never resolving the name again, so a name whose answer changes between the
check and the connection (DNS rebinding) reaches nothing it would not have been allowed to.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from typing import Final
from urllib.parse import urlsplit

import msgspec

from mqgate.errors import BadRequest

MAX_URL_CHARS: Final = 2048
MAX_HEADERS: Final = 20
MAX_HEADER_NAME_CHARS: Final = 64
MAX_HEADER_VALUE_CHARS: Final = 1024
_TOKEN: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE: Final = re.compile(r"[\t\x20-\x7e\x80-\xff]*")
# Headers the gateway writes itself: a consumer's headers may not replace them.
RESERVED_HEADERS: Final = frozenset(
    {
        "host", "content-length", "content-type", "connection", "transfer-encoding", "te", "upgrade",
        "webhook-id", "webhook-timestamp", "webhook-signature", "expect", "keep-alive", "trailer",
    }
)  # fmt: skip
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class EndpointRefused(Exception):
    """The endpoint may not be reached (a private address, a name that does not resolve)."""


class Endpoint(msgspec.Struct, frozen=True):
    url: str
    https: bool
    host: str  # a name or an address, without brackets
    port: int
    target: str  # path and query, as sent on the request line

    @property
    def host_header(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.https else 80
        return shown if self.port == default else f"{shown}:{self.port}"


def parse_endpoint(url: str) -> Endpoint:
    """The endpoint a URL names, or a 400 naming `endpoint`."""

    def bad(why: str) -> BadRequest:
        return BadRequest(f"endpoint {why}", field="endpoint")

    if len(url) > MAX_URL_CHARS:
        raise bad(f"is longer than {MAX_URL_CHARS} characters")
    if any(ch in url for ch in "\r\n\t ") or not url.isascii():
        raise bad("must be an ASCII URL without spaces or line breaks (percent-encode the rest)")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise bad(f"is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise bad("must be an http or https URL")
    if parts.username is not None or parts.password is not None:
        raise bad("may not carry a user or password (use headers)")
    if not parts.hostname:
        raise bad("has no host")
    if parts.fragment:
        raise bad("may not have a fragment")
    https = parts.scheme == "https"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Endpoint(url, https, parts.hostname, port or (443 if https else 80), target)


def check_headers(headers: dict[str, str]) -> dict[str, str]:
    """A consumer's extra headers, or a 400 naming `headers`."""
    if len(headers) > MAX_HEADERS:
        raise BadRequest(f"at most {MAX_HEADERS} headers", field="headers")
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name) or len(name) > MAX_HEADER_NAME_CHARS:
            raise BadRequest(
                f"header name {name[:64]!r} is not an HTTP token of up to 64 characters", field="headers"
            )
        if name.lower() in RESERVED_HEADERS or name.lower().startswith("mq-"):
            raise BadRequest(f"header {name} is set by the gateway", field="headers")
        if not _HEADER_VALUE.fullmatch(value) or len(value) > MAX_HEADER_VALUE_CHARS:
            raise BadRequest(f"header {name}'s value has control characters or is too long", field="headers")
    return dict(headers)


def public(address: Address) -> bool:
    """Reachable on the internet: not private, loopback, link-local, multicast, reserved or
    unspecified (an IPv4 address mapped into IPv6 is judged as the IPv4 one)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


async def resolve(endpoint: Endpoint, allow_private: bool) -> list[str]:
    """The addresses to connect to, each allowed; EndpointRefused if none may be used."""
    try:
        literal: Address | None = ipaddress.ip_address(endpoint.host)
    except ValueError:
        literal = None
    if literal is not None:
        found = [literal]
    else:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                endpoint.host, endpoint.port, type=socket.SOCK_STREAM
            )
        except (socket.gaierror, UnicodeError) as exc:
            raise EndpointRefused(f"{endpoint.host} does not resolve: {exc}") from None
        found = []
        for info in infos:
            address = ipaddress.ip_address(info[4][0])
            if address not in found:
                found.append(address)
    if not allow_private:
        private = [str(a) for a in found if not public(a)]
        if private:  # all or nothing: a name with one private answer is refused outright
            raise EndpointRefused(
                f"{endpoint.host} resolves to a private or local address ({private[0]}); an operator "
                "allows those with push_allow_private_endpoints"
            )
    if not found:
        raise EndpointRefused(f"{endpoint.host} has no address")
    return [str(a) for a in found]
