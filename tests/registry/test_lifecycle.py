"""The operator's lifecycle of producers and consumers (issue 10, section 4): list them, issue a
new token or revoke one (the old token refused at once on this gateway, within the registry
refresh on every other), change a consumer's settings."""

from __future__ import annotations

import subprocess
from typing import Any

import httpx
import pytest

from tests.conftest import MQGATE, Client, Server, wait_until
from tests.store.test_redis_gateways import REFRESH_S, gateways  # noqa: F401  (a fixture)

# Starts gateways or servers test by test: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow


def call(server: Server, method: str, path: str, **body: Any) -> httpx.Response:
    h = {"Authorization": f"Bearer {server.admin_token}"}
    return httpx.request(method, server.url + path, json=body, headers=h, timeout=30)


def produce(server: Server, token: str, producer: str) -> int:
    r = httpx.post(
        server.url + "/mq/produce",
        json={"producer": producer, "message": "x"},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    return r.status_code


def test_producers_are_listed_without_their_tokens(server: Server) -> None:
    ptoken, _ = server.setup_topic("t")
    listed = call(server, "GET", "/admin/producers").json()["result"]["producers"]
    assert listed == [{"name": "t-p", "topic": "t", "destinations": [], "tokenRevoked": False}]
    assert ptoken not in str(listed)


@pytest.mark.parametrize("kind", ["producer", "consumer"])
def test_a_new_token_refuses_the_old_one_at_once_and_revoking_refuses_all(server: Server, kind: str) -> None:
    ptoken, ctoken = server.setup_topic("t")
    name = f"t-{kind[0]}"

    def works(token: str) -> bool:
        if kind == "producer":
            return produce(server, token, name) == 200
        r = httpx.get(
            server.url + "/mq/message",
            params={"topic": "t", "consumer": name},
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        return r.status_code == 200

    old = ptoken if kind == "producer" else ctoken
    assert works(old)
    r = call(server, "POST", f"/admin/{kind}s/{name}/token")
    assert r.status_code == 200, r.text
    new = r.json()["result"]["token"]
    assert new != old and works(new) and not works(old)
    assert call(server, "DELETE", f"/admin/{kind}s/{name}/token").json()["result"] == {
        "name": name,
        "token": None,
    }
    assert not works(new) and not works(old)
    listing = call(server, "GET", f"/admin/{kind}s").json()["result"][f"{kind}s"]
    assert next(x for x in listing if x["name"] == name)["tokenRevoked"] is True
    again = call(server, "POST", f"/admin/{kind}s/{name}/token").json()["result"]["token"]
    assert works(again)
    assert call(server, "POST", f"/admin/{kind}s/nobody/token").status_code == 404


def test_a_consumers_lock_timeout_can_be_changed(server: Server) -> None:
    ptoken, ctoken = server.setup_topic("t", queues=1)
    client = Client(server, ptoken, ctoken)
    r = call(server, "PATCH", "/admin/consumers/t-c", lockTimeoutS=1, maxAttempts=3)
    assert r.status_code == 200, r.text
    assert r.json()["result"]["lockTimeoutS"] == 1.0 and r.json()["result"]["maxAttempts"] == 3
    client.produce("t-p", "m")
    assert client.pull("t", "t-c").json()["result"]["status"] == "FOUND"  # locked, not acked

    def unlocked() -> bool:
        queues = call(server, "GET", "/admin/consumers/t-c/progress").json()["result"]["queues"]
        return not any(q["locked"] for q in queues)

    wait_until(unlocked, 5, "the 1 s lock to expire (the default is 60 s)")
    client.close()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "body"),
        ({"lockTimeoutS": 0}, "lockTimeoutS"),
        ({"maxAttempts": 1.5}, "maxAttempts"),
        ({"mode": "broadcast"}, "mode"),
    ],
)
def test_bad_consumer_changes_are_named(server: Server, body: dict[str, Any], field: str) -> None:
    server.setup_topic("t")
    r = call(server, "PATCH", "/admin/consumers/t-c", **body)
    assert r.status_code == 400 and r.json()["result"]["field"] == field, r.text


def test_a_new_token_reaches_every_gateway_within_the_refresh(gateways: Any) -> None:  # noqa: F811
    a, b = gateways(), gateways()
    ptoken, _ = a.setup_topic("t")
    wait_until(lambda: produce(b, ptoken, "t-p") == 200, 3 * REFRESH_S + 2, "B to know the producer")
    new = call(a, "POST", "/admin/producers/t-p/token").json()["result"]["token"]
    assert produce(a, ptoken, "t-p") == 401
    wait_until(lambda: produce(b, ptoken, "t-p") == 401, 3 * REFRESH_S + 2, "B to refuse the old token")
    assert produce(b, new, "t-p") == 200


def test_revocations_deletions_and_growth_reach_every_gateway_at_once(gateways: Any) -> None:  # noqa: F811
    # A refresh period of a minute: only the change notice can make B see these in time.
    a, b = gateways(refresh_s=60), gateways(refresh_s=60)
    ptoken, ctoken = a.setup_topic("t", queues=2)
    assert produce(b, ptoken, "t-p") == 200  # B looks the unknown token up (a miss)
    call(a, "DELETE", "/admin/producers/t-p/token")
    wait_until(lambda: produce(b, ptoken, "t-p") == 401, 1.0, "B to refuse the revoked token")

    def pulls(server: Server) -> int:
        h = {"Authorization": f"Bearer {ctoken}"}
        return httpx.get(
            server.url + "/mq/message", params={"topic": "t", "consumer": "t-c"}, headers=h
        ).status_code

    assert pulls(b) == 200
    assert call(a, "DELETE", "/admin/consumers/t-c").status_code == 200
    wait_until(lambda: pulls(b) == 401, 1.0, "B to refuse the deleted consumer")

    new = call(a, "POST", "/admin/producers/t-p/token").json()["result"]["token"]
    assert call(a, "PATCH", "/admin/topics/t", queues=4).status_code == 200

    def queues_used_on_b() -> set[int]:
        h = {"Authorization": f"Bearer {new}"}
        msgs = [{"message": "m", "orderKey": f"k{i}"} for i in range(40)]
        r = httpx.post(b.url + "/mq/produce/batch", json={"producer": "t-p", "messages": msgs}, headers=h)
        return {x["queue"] for x in r.json()["result"]["receipts"]} if r.status_code == 200 else set()

    wait_until(
        lambda: queues_used_on_b() == {0, 1, 2, 3}, 1.0, "B to produce to the grown topic's new queues"
    )


def test_the_cli_lists_rekeys_and_changes(server: Server) -> None:
    ptoken, _ = server.setup_topic("t")
    base = [MQGATE]
    opts = ["--url", server.url, "--admin-token", server.admin_token]

    def run(*args: str) -> str:
        done = subprocess.run([*base, *args, *opts], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "t-p" in run("producer", "list") and ptoken not in run("producer", "list")
    out = run("producer", "token", "t-p")
    new = out.split("new token ", 1)[1].split()[0]
    assert produce(server, new, "t-p") == 200 and produce(server, ptoken, "t-p") == 401
    assert "token revoked" in run("producer", "token", "t-p", "--revoke")
    assert "lock timeout 2 s, max attempts 7" in run(
        "consumer", "set", "t-c", "--lock-timeout-s", "2", "--max-attempts", "7"
    )
    assert "8 queues per lane" in run("topic", "grow", "t", "--queues", "8")
    assert "12 queues per lane, max priority 1" in run(
        "topic", "grow", "t", "--queues", "12", "--max-priority", "1"
    )
    assert "consumer t-c deleted" in run("consumer", "delete", "t-c", "--keep-dead-letters")
    assert "producer t-p deleted" in run("producer", "delete", "t-p")
    assert "topic t deleted" in run("topic", "delete", "t")
    assert "t" not in [t["name"] for t in server.admin("GET", "/admin/topics")["topics"]]
    assert "%DLQ%t-c" in [t["name"] for t in server.admin("GET", "/admin/topics")["topics"]]
