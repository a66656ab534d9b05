"""The producer spool through the gateway (SPEC E7), two gateways on one project, and bad
failover input: real redis-servers and gateway processes, killed by PID."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import MQGATE, Server, wait_until
from tests.failover.conftest import FailoverRedis
from tests.failover.test_gateway_failover import consume_until, failover_state, gateway, project_on

# Starts gateways or servers test by test: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow


def _produce(gw: Server, token: str, bodies: list[str]) -> httpx.Response:
    messages = [{"message": b, "orderKey": "one-queue"} for b in bodies]
    return httpx.post(
        gw.url + "/mq/produce/batch",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
        json={"producer": "orders-p", "messages": messages},
    )


def test_both_clusters_down_spool_then_503_then_replay_in_order_after_a_gateway_kill9(
    tmp_path: Path, redis_pair: tuple[FailoverRedis, FailoverRedis]
) -> None:
    primary, backup = redis_pair
    data = tmp_path / "gw" / "data"
    gw = gateway(data, MQGATE_SPOOL_MAX_BYTES=str(64 * 1024))
    gw.start()
    try:
        ptoken, ctoken = project_on(gw, primary, backup)
        sent = [f"s{i:05d}" for i in range(50)]
        assert _produce(gw, ptoken, sent).status_code == 200
        primary.kill9()
        backup.kill9()
        spooled: list[str] = []
        refused = None
        for batch in range(200):
            bodies = [f"s{50 + batch * 10 + i:05d}" for i in range(10)]
            r = _produce(gw, ptoken, bodies)
            if r.status_code != 200:
                refused = r
                break
            assert {rc["status"] for rc in r.json()["result"]["receipts"]} == {"spooled"}
            spooled += bodies
        assert refused is not None, "the spool never filled up"
        assert refused.status_code == 503 and refused.json()["result"]["code"] == "spool_full"
        assert int(refused.headers["Retry-After"]) >= 1
        stats = gw.admin("GET", "/admin/spool")
        assert stats["pending"] == len(spooled) > 0
        gw.kill9()  # with a non-empty spool

        gw.start()  # the same data directory: the spool is found again
        assert gw.admin("GET", "/admin/spool")["pending"] == len(spooled)
        backup.start()  # one cluster returns: the project moves there, the spool is replayed
        wait_until(lambda: gw.admin("GET", "/admin/spool")["pending"] == 0, 30, "the spool replayed")
        state = failover_state(gw)
        primary.start()
        wait_until(lambda: not failover_state(gw)["draining"], 30, "the primary drained")
        count = len(sent) + len(spooled)
        got = [m["message"] for m in consume_until(gw.url, ctoken, lambda got: len(got) >= count, 60)]
        print(
            f"\nboth down: {len(spooled)} spooled, then 503 spool_full; after the gateway's kill -9 "
            f"and restart all replayed to {state['active']}, {len(got)} consumed"
        )
        # Every acknowledged produce consumed; the spooled ones in the order they were produced
        # (the 50 from before the failure were drained from the primary after them).
        assert sorted(set(got)) == sorted(sent + spooled)
        assert [b for b in got if b in set(spooled)] == spooled
    finally:
        gw.stop()


def test_two_gateways_switch_a_project_the_same_way(
    tmp_path: Path, redis_pair: tuple[FailoverRedis, FailoverRedis]
) -> None:
    primary, backup = redis_pair
    data = tmp_path / "shared" / "data"  # one registry (SQLite) shared by both gateways
    data.parent.mkdir(parents=True)
    gws = [gateway(data), gateway(data)]
    # The second gateway needs its own data directory for its spool but the same registry.
    gws[1].data_dir = tmp_path / "second" / "data"
    gws[1].data_dir.parent.mkdir(parents=True)
    gws[1].env["MQGATE_REGISTRY"] = f"sqlite:///{data.resolve() / 'registry.db'}"
    for g in gws:
        g.start()
    try:
        ptoken, _ = project_on(gws[0], primary, backup)
        wait_until(
            lambda: failover_state(gws[1]).get("active") == "p", 10, "the second gateway sees the project"
        )
        primary.kill9()
        killed = time.monotonic()
        seen = {}
        while len(seen) < 2:
            for i, g in enumerate(gws):
                if i not in seen and failover_state(g)["active"] == "b":
                    seen[i] = time.monotonic() - killed
            assert time.monotonic() - killed < 10, f"switched: {seen}"
        states = [failover_state(g) for g in gws]
        assert states[0]["epoch"] == states[1]["epoch"] == 2
        for g in gws:
            r = _produce(g, ptoken, ["after"])
            assert r.status_code == 200 and r.json()["result"]["receipts"][0]["status"] == "stored"
        print(f"\ntwo gateways switched after {seen[0]:.2f}s and {seen[1]:.2f}s (one epoch)")
        assert abs(seen[0] - seen[1]) < 2.0  # the bound: 2 x failover_check_s (0.4 s) plus the polling here
    finally:
        for g in gws:
            g.stop()


BAD = [
    ("POST", "/admin/clusters", {"name": "x", "url": "http://nope"}, 400, "url"),
    ("POST", "/admin/clusters", {"name": "x", "url": "embedded:"}, 400, "url"),
    ("POST", "/admin/clusters", {"name": "bad name", "url": "redis://127.0.0.1:1/0"}, 400, "name"),
    ("POST", "/admin/clusters", {"name": "x"}, 400, "url"),
    ("POST", "/admin/clusters", {"name": "p", "url": "redis://127.0.0.1:2/0"}, 409, "name"),
    ("PUT", "/admin/projects/shop/clusters", {"primary": "nosuch"}, 400, "primary"),
    ("PUT", "/admin/projects/shop/clusters", {"primary": "p", "backup": "nosuch"}, 400, "backup"),
    ("PUT", "/admin/projects/shop/clusters", {"primary": "p", "backup": "p"}, 400, "backup"),
    ("PUT", "/admin/projects/nosuch/clusters", {"primary": "p"}, 404, "project"),
    ("GET", "/admin/clusters/nosuch", None, 404, "cluster"),
    ("GET", "/admin/projects/shop/failover", None, 404, "project"),
    ("POST", "/admin/projects/shop/failback", None, 404, "project"),
]


def test_bad_failover_input_is_a_4xx_naming_the_field(tmp_path: Path) -> None:
    gw = gateway(tmp_path / "gw" / "data").start()
    auth = {"Authorization": f"Bearer {gw.admin_token}"}
    try:
        gw.admin("POST", "/admin/clusters", name="p", url="redis://127.0.0.1:1/0")
        gw.admin("POST", "/admin/clusters", name="b", url="redis://127.0.0.1:2/0")
        gw.admin("POST", "/admin/projects", name="shop")
        for method, path, body, status, field in BAD:
            r = httpx.request(method, gw.url + path, json=body, headers=auth)
            assert (r.status_code, r.json()["result"].get("field")) == (status, field), (method, path, r.text)
        assert (
            httpx.post(gw.url + "/admin/clusters", json={"name": "z", "url": "redis://h/0"}).status_code
            == 401
        )
        gw.admin("PUT", "/admin/projects/shop/clusters", primary="p", backup="b")
        used = httpx.delete(gw.url + "/admin/clusters/p", headers=auth)
        assert used.status_code == 409 and used.json()["result"]["field"] == "name"
        # Both clusters unreachable from the start: the project has an active record all the same,
        # its produces are spooled, and the other projects' topics are made and served as usual.
        assert gw.admin("GET", "/admin/projects/shop/failover")["active"] in ("p", "b")
        gw.admin("POST", "/admin/topics", name="orders", queues=2, project="shop")
        gw.admin("POST", "/admin/topics", name="other", queues=2)
        tokens = {
            t: gw.admin("POST", "/admin/producers", name=f"{t}-p", topic=t)["token"]
            for t in ("orders", "other")
        }
        for topic, status in (("other", "stored"), ("orders", "spooled")):
            r = httpx.post(gw.url + "/mq/produce", json={"producer": f"{topic}-p", "message": "m"},
                           headers={"Authorization": f"Bearer {tokens[topic]}"}, timeout=30)  # fmt: skip
            assert r.status_code == 200 and r.json()["result"].get("status", "stored") == status, r.text
    finally:
        gw.stop()


def test_the_cli_adds_clusters_assigns_a_project_and_fails_it_back(
    tmp_path: Path, redis_pair: tuple[FailoverRedis, FailoverRedis]
) -> None:
    primary, backup = redis_pair
    gw = gateway(tmp_path / "gw" / "data").start()

    def cli(*args: str) -> str:
        done = subprocess.run(
            [MQGATE, "cluster", *args, "--url", gw.url, "--admin-token", gw.admin_token],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    try:
        assert "cluster p added to pool main: healthy" in cli("add", "p", primary.url, "--pool", "main")
        cli("add", "b", backup.url, "--pool", "main")
        listing = cli("list")
        assert "p " in listing and "b " in listing and "healthy" in listing
        gw.admin("POST", "/admin/projects", name="shop")
        assigned = cli("assign", "shop", "--primary", "p", "--backup", "b")
        assert "project shop: active p (primary p, backup b, epoch 1)" in assigned
        primary.kill9()
        wait_until(lambda: "active b" in cli("failover", "shop"), 10, "the switch")
        assert "last switch: p is failed" in cli("failover", "shop")
        primary.start()
        wait_until(lambda: gw.admin("GET", "/admin/clusters/p")["state"] == "healthy", 15, "p healthy")
        assert "active p" in cli("failback", "shop")
        assert '"pending": 0' in subprocess.run(
            [MQGATE, "--json", "cluster", "spool", "--url", gw.url, "--admin-token", gw.admin_token],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        refused = subprocess.run(
            [MQGATE, "cluster", "delete", "p", "--url", gw.url, "--admin-token", gw.admin_token],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert refused.returncode != 0 and "serves projects shop" in refused.stderr
    finally:
        gw.stop()
