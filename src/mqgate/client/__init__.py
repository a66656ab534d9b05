"""The one Python client of the gateway's HTTP API, used by the CLI, the Spark source and sink
and the pipeline.

Every failure is a `mqgate.errors` exception (mqgate.client.failures, the one mapping): an
error answer's JSON envelope {status, message, result: {code, field}} becomes the matching
class (BadRequest, NotFound, Conflict, Unavailable with the answer's Retry-After ...), and a
gateway that cannot be reached is `Unavailable` with code `unreachable`.

The transport (mqgate.client.transport) is the standard library's http.client on kept-alive
connections: a plain install needs no HTTP library, and Spark tasks reading megabyte pages of
/mq/read pay a quarter of what httpx costs per byte.
"""

from mqgate.client.api import PRODUCE_MAX_BYTES, PRODUCE_MAX_MESSAGES, Client, QueueBounds, batch_ranges
from mqgate.client.failures import UNREACHABLE, error_from_answer

__all__ = [
    "PRODUCE_MAX_BYTES",
    "PRODUCE_MAX_MESSAGES",
    "UNREACHABLE",
    "Client",
    "QueueBounds",
    "batch_ranges",
    "error_from_answer",
]
