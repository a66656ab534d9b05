"""`python -m mqgate.storeproc`: the store process `mqgate serve --workers N` starts on the
embedded store. Settings from MQGATE_* (as its workers'); it serves until SIGTERM or SIGINT,
then closes its backends (their last group commit round written and synced)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from mqgate.storeproc.process import serve


def main() -> int:
    from mqgate.settings import load_settings

    parser = argparse.ArgumentParser(prog="python -m mqgate.storeproc")
    parser.add_argument("--parent", type=int, help="stop when this process is gone (the serve command)")
    args = parser.parse_args()
    settings = load_settings()
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s store-process %(levelname)s %(name)s: %(message)s",
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's ^C is for the serve command
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency of the plain install
        pass
    asyncio.run(serve(settings, parent_pid=args.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
