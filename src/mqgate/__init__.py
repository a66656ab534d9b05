"""mqgate: an HTTP gateway to a durable message log.

Code and docs cite requirements as "SPEC Xn" (G1-G9, S1-S6, P1-P8, E1-E8, D1-D4): entry Xn of
docs/DESIGN.md, which says what each one asks and where and how the code meets it.
"""

from typing import Final

__version__: Final = "0.1.0"
