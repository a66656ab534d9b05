"""A gateway with the console, as `mqgate serve` builds it (`build_site`), with the test's
sign-in limits and charts sampled every second.

Usage: python -m tests.console.serve PORT DATA_DIR [PER_USER PER_IP]
"""

from __future__ import annotations

import sys

import uvicorn

from mqgate.app import build_site
from mqgate.preparation import prepare
from mqgate.settings import load_settings


def main(argv: list[str]) -> None:
    port, data_dir = int(argv[0]), argv[1]
    per_user, per_ip = (int(argv[2]), int(argv[3])) if len(argv) > 3 else (3, 1000)
    settings = load_settings(
        host="127.0.0.1",
        port=port,
        data_dir=data_dir,
        console_signin_failures_per_user=per_user,
        console_signin_failures_per_ip=per_ip,
        console_signin_window_s=600.0,
    )
    prepare(settings)
    built = build_site(settings)
    built.platform.metrics_history.sample_every_s = 1.0  # charts fill within seconds
    uvicorn.run(
        built.site,
        host="127.0.0.1",
        port=port,
        lifespan="on",
        log_level="warning",
        access_log=False,
        proxy_headers=False,  # as `mqgate serve`: the console decides whom to trust
    )


if __name__ == "__main__":
    main(sys.argv[1:])
