"""Only for mqgate.spark.commit_progress, which still imports `Gateway` from here: the client
is mqgate.client. Delete this module once that import reads `from mqgate.client import Client`."""

from __future__ import annotations

from mqgate.client import Client as Gateway

__all__ = ["Gateway"]
