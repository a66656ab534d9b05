"""A gateway with the console mounted, as the lead will mount it in build_app: the real
`build_app`, and `/console` dispatched to the console (test-only until api/app.py mounts it).

Usage: python -m tests.console.serve PORT DATA_DIR [PER_USER PER_IP]
"""

from __future__ import annotations

import sys
from typing import Any

import uvicorn

from mqgate.api.app import build_app, prepare
from mqgate.console.app import build_console, with_console
from mqgate.console.throttle import Limits
from mqgate.services.gateway import Gateway
from mqgate.settings import load_settings


def gateway_of(app: Any) -> Gateway:
    """The Gateway build_app made (its admin routes hold it)."""
    for route in app.router.routes:
        gateway = getattr(getattr(route.handler, "__self__", None), "gw", None)
        if isinstance(gateway, Gateway):
            return gateway
    raise RuntimeError("no gateway found in the app's routes")


def main(argv: list[str]) -> None:
    port, data_dir = int(argv[0]), argv[1]
    per_user, per_ip = (int(argv[2]), int(argv[3])) if len(argv) > 3 else (3, 1000)
    settings = load_settings(host="127.0.0.1", port=port, data_dir=data_dir)
    prepare(settings)
    api = build_app(settings)
    console = build_console(
        gateway_of(api),
        settings,
        settings.resolved_registry_url(),
        limits=Limits(per_user=per_user, per_ip=per_ip, window_ms=10 * 60 * 1000),
    )
    uvicorn.run(
        with_console(api, console),
        host="127.0.0.1",
        port=port,
        lifespan="on",
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
