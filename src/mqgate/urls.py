"""URLs fit to show (logs, errors, the console): a password in them hidden. Without any driver
imported, so a gateway without redis-py can show one."""

from __future__ import annotations


def redact(url: str) -> str:
    """The URL with any password replaced, fit for logs and error messages."""
    scheme, sep, rest = url.partition("://")
    if "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{host}" if ":" in creds else f"{scheme}{sep}{creds}@{host}"
