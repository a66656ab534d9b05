"""What the console's pages send besides the page: the security headers and the form limit."""

from __future__ import annotations

from typing import Final

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


# A generated report (mqgate analytics): its own inline styles and embedded plots, no script.
REPORT_CSP: Final = b"default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'"
