"""Only for `python -m mqgate.pipeline` (mqgate/pipeline/__main__.py imports `main` from here):
the command is mqgate.cli.pipeline. Delete this module once __main__ imports it from there."""

from __future__ import annotations

from mqgate.cli.pipeline import main

__all__ = ["main"]
