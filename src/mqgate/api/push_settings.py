"""A consumer registration's push settings (issue 31, docs/PUSH.md): checked (the endpoint's URL,
its headers, that its host is allowed: push/endpoints.py) and turned into the record's JSON,
with the signing secret shown once in the answer."""

from __future__ import annotations

from typing import Final

from mqgate.api.shapes import ConsumerIn
from mqgate.errors import BadRequest
from mqgate.push.config import encode_config, new_config
from mqgate.push.endpoints import EndpointRefused, check_headers, parse_endpoint, resolve
from mqgate.push.signing import new_secret
from mqgate.settings import Settings

# ConsumerIn's push fields, with their wire names.
PUSH_FIELDS: Final = {
    "endpoint": "endpoint",
    "headers": "headers",
    "max_in_flight": "maxInFlight",
    "timeout_s": "timeoutS",
    "ordering": "ordering",
    "backoff_initial_ms": "backoffInitialMs",
    "backoff_max_ms": "backoffMaxMs",
    "envelope": "envelope",
}


async def push_settings(inp: ConsumerIn, gateway_secret: bytes, settings: Settings) -> tuple[str, str | None]:
    """(the record's push settings, the signing secret) for a push consumer; ("", None) else."""
    given = [wire for name, wire in PUSH_FIELDS.items() if getattr(inp, name) is not None]
    if inp.mode != "push":
        if given:
            raise BadRequest(f"{given[0]} is a setting of mode=push consumers", field=given[0])
        return "", None
    if inp.endpoint is None:
        raise BadRequest("a push consumer needs an endpoint", field="endpoint")
    endpoint = parse_endpoint(inp.endpoint)
    headers = check_headers(inp.headers or {})
    if inp.backoff_initial_ms and inp.backoff_max_ms and inp.backoff_max_ms < inp.backoff_initial_ms:
        raise BadRequest("backoffMaxMs is less than backoffInitialMs", field="backoffMaxMs")
    try:
        await resolve(endpoint, settings.push_allow_private_endpoints)
    except EndpointRefused as exc:
        raise BadRequest(f"endpoint refused: {exc}", field="endpoint") from None
    secret = new_secret()
    config = new_config(
        inp.name,
        endpoint.url,
        gateway_secret,
        secret,
        headers=headers,
        max_in_flight=inp.max_in_flight,
        timeout_s=inp.timeout_s,
        ordering=inp.ordering,
        backoff_initial_ms=inp.backoff_initial_ms,
        backoff_max_ms=inp.backoff_max_ms,
        envelope=inp.envelope,
    )
    return encode_config(config), secret
