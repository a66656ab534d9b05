"""mqgate: an HTTP gateway to a durable message log."""

from typing import Final

__version__: Final = "0.1.0"
