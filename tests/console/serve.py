"""A gateway with the console mounted: the real `build_app`, `/console` dispatched to a console
with the test's sign-in limits, and the admin API's changes audited as the lead's one line in
build_app will audit them (`audited_routes`; wrapping twice is harmless).

Usage: python -m tests.console.serve PORT DATA_DIR [PER_USER PER_IP]
"""

from __future__ import annotations

import sys
from typing import Any

import uvicorn

from mqgate.app import build_app, prepare
from mqgate.console.api_audit import audited_routes
from mqgate.console.app import build_console, with_console
from mqgate.console.throttle import Limits
from mqgate.platform import Platform
from mqgate.settings import load_settings
from mqgate.web.router import Router


def platform_of(app: Any) -> Platform:
    """The Platform build_app made (the project routes hold it)."""
    for route in app.router.routes:
        platform = getattr(getattr(route.handler, "__self__", None), "platform", None)
        if isinstance(platform, Platform):
            return platform
    raise RuntimeError("no platform found in the app's routes")


def main(argv: list[str]) -> None:
    port, data_dir = int(argv[0]), argv[1]
    per_user, per_ip = (int(argv[2]), int(argv[3])) if len(argv) > 3 else (3, 1000)
    settings = load_settings(host="127.0.0.1", port=port, data_dir=data_dir)
    prepare(settings)
    api = build_app(settings)
    platform = platform_of(api)
    console = build_console(
        platform,
        settings,
        settings.resolved_registry_url(),
        limits=Limits(per_user=per_user, per_ip=per_ip, window_ms=10 * 60 * 1000),
    )
    platform.metrics_history.sample_every_s = 1.0  # charts fill within seconds
    api.router = Router(audited_routes(api.router.routes, platform.gateway, console.console.engine))
    uvicorn.run(
        with_console(api, console),
        host="127.0.0.1",
        port=port,
        lifespan="on",
        log_level="warning",
        access_log=False,
        proxy_headers=False,  # as `mqgate serve`: the console decides whom to trust
    )


if __name__ == "__main__":
    main(sys.argv[1:])
