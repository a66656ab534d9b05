"""`mqgate cluster add` of a Redis cluster on a gateway installed without the Redis extra: a 400
naming the extra to install, and nothing kept (no cluster row, no error logged every second).

The gateway runs with a `redis` package first on its path that fails to import, as on a plain
`pip install mqgate`; the shared venv keeps its real redis-py."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx

from tests.conftest import MQGATE, Server

EXTRA = "pip install 'mqgate[redis]'"


def without_redis_driver(tmp_path: Path) -> dict[str, str]:
    hidden = tmp_path / "no-redis"
    (hidden / "redis").mkdir(parents=True)
    (hidden / "redis" / "__init__.py").write_text(
        "raise ImportError('redis-py is hidden from this gateway by the test')\n"
    )
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(hidden), os.environ.get("PYTHONPATH")]))}


def test_adding_a_redis_cluster_without_the_driver_is_refused_and_keeps_nothing(tmp_path: Path) -> None:
    srv = Server(tmp_path / "data", env=without_redis_driver(tmp_path)).start()
    try:
        auth = {"Authorization": f"Bearer {srv.admin_token}"}
        r = httpx.post(
            srv.url + "/admin/clusters",
            json={"name": "r1", "url": "redis://127.0.0.1:6379/0"},
            headers=auth,
            timeout=30,
        )
        assert r.status_code == 400, r.text
        body = r.json()
        assert EXTRA in body["message"] and body["result"]["field"] == "url", body

        done = subprocess.run(
            [MQGATE, "cluster", "add", "r2", "redis://127.0.0.1:6379/0", "--url", srv.url,
             "--admin-token", srv.admin_token],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 1, done.stdout + done.stderr
        assert EXTRA in done.stderr, done.stderr

        assert srv.admin("GET", "/admin/clusters")["clusters"] == []
        time.sleep(2.5)  # the failover task's rounds (every second) find nothing to build
        assert srv.admin("GET", "/admin/clusters")["clusters"] == []
        log = srv.log_tail()
        assert "Traceback" not in log and "failover check failed" not in log, log
        # An embedded cluster needs no driver: still added.
        added = srv.admin("POST", "/admin/clusters", name="e1", url=f"embedded:{tmp_path / 'e1'}")
        assert added["name"] == "e1"
    finally:
        srv.stop()


def test_a_redis_cluster_kept_by_a_gateway_with_the_driver_does_not_stop_one_without_it(
    tmp_path: Path,
) -> None:
    """The cluster rows are shared (the registry's database): one a gateway without the driver
    cannot build is shown degraded in /healthz, once, and the gateway starts and serves."""
    data = tmp_path / "data"
    srv = Server(data).start()
    try:
        srv.admin("POST", "/admin/clusters", name="r1", url="redis://127.0.0.1:1/0")
    finally:
        srv.stop()
    srv = Server(data, env={**without_redis_driver(tmp_path), "MQGATE_FAILOVER_CHECK_S": "0.2"}).start()
    try:
        time.sleep(2.0)  # ten failover rounds
        health = httpx.get(srv.url + "/healthz", timeout=10).json()["result"]
        assert EXTRA in health["degraded"]["cluster r1"], health
        log = srv.log_tail()
        assert "failover check failed" not in log and log.count(EXTRA) == 1, log
        ptoken, _ = srv.setup_topic("still", queues=1)
        r = httpx.post(
            srv.url + "/mq/produce",
            json={"producer": "still-p", "message": "served"},
            headers={"Authorization": f"Bearer {ptoken}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
    finally:
        srv.stop()
