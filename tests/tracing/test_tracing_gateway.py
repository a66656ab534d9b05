"""Projects and tracing through real gateways (issue 11): a traced message's whole path by
msgId, requestId and key; untraced projects record nothing; policies combine; levels keep what
they promise; bad policies are named; a policy reaches a second gateway; nothing of a 200 is
lost to kill -9."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from typing import Any

import httpx
import pytest

from mqgate.core.trace_context import derived_traceparent
from tests.conftest import MQGATE, Client, Server, wait_until
from tests.store.test_redis_gateways import gateways  # noqa: F401  (a fixture)

# Starts gateways or servers test by test: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow


def traces(server: Server, **query: str) -> dict[str, Any]:
    h = {"Authorization": f"Bearer {server.admin_token}"}
    r = httpx.get(server.url + "/admin/traces", params=query, headers=h, timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json()["result"])


def setup(server: Server, project: str, topic: str, queues: int = 1, **consumer: Any) -> Client:
    server.admin("POST", "/admin/projects", name=project)
    server.admin("POST", "/admin/topics", name=topic, queues=queues, project=project)
    ptoken = server.admin("POST", "/admin/producers", name=f"{topic}-p", topic=topic)["token"]
    ctoken = server.admin("POST", "/admin/consumers", name=f"{topic}-c", topic=topic, **consumer)["token"]
    return Client(server, ptoken, ctoken)


def pull_found(client: Client, topic: str, timeout_s: float = 15) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        res = client.pull(topic, f"{topic}-c", max=10, wait=1).json()["result"]
        return dict(res) if res["status"] == "FOUND" else None

    return dict(wait_until(found, timeout_s, f"a message on {topic}"))


def test_a_batch_keeps_each_message_s_own_trace_context_and_gives_the_others_the_request_s(
    server: Server,
) -> None:
    client = setup(server, "ctx", "ctxt")
    server.admin("POST", "/admin/trace-policies", mode="project", project="ctx", level="info")
    request_ctx = f"00-{'a' * 32}-{'b' * 16}-01"
    own_ctx = f"00-{'c' * 32}-{'d' * 16}-01"
    messages = [
        {"message": "plain"},
        {"message": "own", "properties": {"traceparent": own_ctx}},
        {"message": "other", "properties": {"shop": "17"}},
        {"message": "plain again"},
    ]
    r = client.http.post(
        "/mq/produce/batch",
        json={"producer": "ctxt-p", "messages": messages},
        headers={"Authorization": f"Bearer {client.ptoken}", "traceparent": request_ctx},
    )
    assert r.status_code == 200, r.text
    ids = [m["msgId"] for m in r.json()["result"]["receipts"]]
    got = pull_found(client, "ctxt")["msgList"]
    props = {m["messageId"]: m["properties"] for m in got}
    want = [request_ctx, own_ctx, request_ctx, request_ctx]
    assert [props[i]["traceparent"] for i in ids] == want
    assert props[ids[2]]["shop"] == "17" and props[ids[0]] == {"traceparent": request_ctx}
    for msg_id, ctx in zip(ids, want, strict=True):
        found = wait_until(lambda m=msg_id: traces(server, msgId=m)["paths"], 15, "the trace")
        assert found[0]["traceparent"] == ctx
    client.close()


def test_a_traced_message_without_a_context_stores_none_and_is_delivered_its_derived_one(
    server: Server,
) -> None:
    client = setup(server, "drv", "drvt")
    server.admin("POST", "/admin/trace-policies", mode="project", project="drv", level="info")
    own_ctx = f"00-{'c' * 32}-{'d' * 16}-01"
    messages = [
        {"message": "plain"},
        {"message": "own", "properties": {"traceparent": own_ctx}},
        {"message": "bad", "properties": {"traceparent": "not a context", "shop": "17"}},
    ]
    r = client.produce_batch("drvt-p", messages)
    assert r.status_code == 200, r.text
    ids = [m["msgId"] for m in r.json()["result"]["receipts"]]
    # Stored: the producer's properties as sent, no context added (the derived one costs no bytes).
    h = {"Authorization": f"Bearer {client.ctoken}"}
    read = {"topic": "drvt", "queue": 0, "offset": 0, "max": 3, "consumer": "drvt-c"}
    stored = httpx.get(server.url + "/mq/read", params=read, headers=h).json()["result"]["msgList"]
    assert [m["properties"] for m in stored] == [m.get("properties", {}) for m in messages]
    # Delivered: each with its context, the producer's when valid, else derived from its id.
    got = {m["messageId"]: m["properties"] for m in pull_found(client, "drvt")["msgList"]}
    want = [derived_traceparent(ids[0]), own_ctx, derived_traceparent(ids[2])]
    assert [got[i]["traceparent"] for i in ids] == want
    assert got[ids[2]]["shop"] == "17"
    for msg_id, ctx in zip(ids, want, strict=True):
        found = wait_until(lambda m=msg_id: traces(server, msgId=m)["paths"], 15, "the trace")
        assert found[0]["traceparent"] == ctx
    client.close()
    # An untraced delivery is as stored.
    other = setup(server, "undrv", "undrvt")
    assert other.produce("undrvt-p", "plain").status_code == 200
    assert pull_found(other, "undrvt")["msgList"][0]["properties"] == {}
    other.close()


def test_a_traced_path_through_every_hop_by_id_request_and_key(server: Server) -> None:
    client = setup(server, "shop", "orders", maxAttempts=2, lockTimeoutS=1)
    try:
        server.admin("POST", "/admin/trace-policies", mode="project", project="shop", level="debug")
        r = client.produce("orders-p", "pay 10", keys=["order-17"], delayMs=300)
        assert r.json()["result"]["status"] == "scheduled", r.text
        msg_id = r.json()["result"]["msgId"]
        first = pull_found(client, "orders")
        assert client.call("/mq/release", requestId=first["requestId"]).status_code == 200
        second = pull_found(client, "orders")  # from the retry queue after the 1 s backoff
        assert second["msgList"][0]["messageId"] == msg_id
        assert client.call("/mq/release", requestId=second["requestId"]).status_code == 200

        def dead() -> dict[str, Any] | None:
            found = traces(server, msgId=msg_id)
            hops = [h["hop"] for h in found["paths"][0]["hops"]] if found["paths"] else []
            return found if "dead_lettered" in hops and not found["mayBeIncomplete"] else None

        found = wait_until(dead, 20, "the dead-lettering to be traced")
        path = found["paths"][0]
        hops = [h["hop"] for h in path["hops"]]
        for before, after in [
            ("accepted", "scheduled"),
            ("scheduled", "due"),
            ("due", "delivered"),
            ("delivered", "released"),
            ("released", "redelivered"),
            ("redelivered", "dead_lettered"),
        ]:
            assert hops.index(before) < hops.index(after), hops
        assert hops.count("delivered") == 2 and path["keys"] == ["order-17"] and path["project"] == "shop"
        assert path["traceparent"].startswith("00-")
        assert path["failures"][-1]["failure"]["cause"] == "max_attempts"
        assert path["consumers"] == [{"consumer": "orders-c", "state": "dead_lettered", "committed": 1}]
        delivered = [h for h in path["hops"] if h["hop"] == "delivered"]
        assert delivered[0]["consumer"] == "orders-c" and delivered[0]["resource"]["service"] == "mqgate"
        assert all(h["latencyMs"] >= 0 for h in path["hops"][1:])
        by_request = traces(server, requestId=first["requestId"])["paths"]
        assert [p["msgId"] for p in by_request] == [msg_id]
        assert [p["msgId"] for p in traces(server, key="order-17")["paths"]] == [msg_id]
    finally:  # its sockets closed whatever fails (a leak fails a later test: warnings are errors)
        client.close()


def test_info_keeps_the_content_by_reference_and_the_path_shows_it_from_the_store(server: Server) -> None:
    client = setup(server, "refs", "rf", queues=2)  # the batch is one record of two parts
    server.admin("POST", "/admin/trace-policies", mode="project", project="refs", level="info")
    single = client.produce("rf-p", "the single body").json()["result"]["msgId"]
    r = client.http.post(
        "/mq/produce/batch",
        json={"producer": "rf-p", "messages": [{"message": f"batch body {i}"} for i in range(3)]},
        headers={"Authorization": f"Bearer {client.ptoken}"},
    )
    assert r.status_code == 200, r.text
    batch = [rc["msgId"] for rc in r.json()["result"]["receipts"]]
    for msg_id, body in [(single, "the single body"), *((m, f"batch body {i}") for i, m in enumerate(batch))]:
        path = wait_until(lambda m=msg_id: traces(server, msgId=m)["paths"], 15, "the trace")[0]
        hops = {h["hop"]: h for h in path["hops"]}
        assert hops["stored"]["body"] == body and hops["stored"]["contentRef"] is True
        assert "body" not in hops["accepted"]
    # No copy of any body in what the trace stored (its index holds each record as stored).
    rows = sqlite3.connect(server.data_dir / "trace-index.sqlite").execute(
        "SELECT event FROM mqgate_trace_events"
    )
    stored = " ".join(row[0] for row in rows)
    assert batch[0] in stored and "body" not in stored.replace("contentRef", "")
    assert '"parts":[{' in stored and {
        h["queue"] for m in batch for h in traces(server, msgId=m)["paths"][0]["hops"] if h["hop"] == "stored"
    } == {0, 1}
    client.close()


def test_an_untraced_project_records_nothing(server: Server) -> None:
    client = setup(server, "quiet", "calm")
    server.admin("POST", "/admin/projects", name="loud")
    server.admin("POST", "/admin/trace-policies", mode="project", project="loud")
    msg_id = client.produce("calm-p", "x", keys=["k"]).json()["result"]["msgId"]
    res = pull_found(client, "calm")
    assert client.call("/mq/ack", requestId=res["requestId"]).status_code == 200
    found = traces(server, msgId=msg_id)
    assert found["paths"] == [] and found["mayBeIncomplete"] is False
    assert traces(server, key="k")["paths"] == []
    client.close()


def test_two_policies_trace_once_at_the_higher_level(server: Server) -> None:
    client = setup(server, "two", "both")
    server.admin("POST", "/admin/trace-policies", mode="route", topic="both", level="info")
    server.admin("POST", "/admin/trace-policies", mode="service", service="both-p", level="debug")
    msg_id = client.produce("both-p", "twice?").json()["result"]["msgId"]
    path = wait_until(lambda: traces(server, msgId=msg_id)["paths"], 10, "the trace")[0]
    assert path["level"] == "debug"
    assert [h["hop"] for h in path["hops"]].count("accepted") == 1
    assert [h["hop"] for h in path["hops"]].count("stored") == 1
    client.close()


@pytest.mark.parametrize(("level", "kept"), [("info", False), ("error", False), ("debug", True)])
def test_levels_record_what_they_promise(server: Server, level: str, kept: bool) -> None:
    client = setup(server, "lv", "lvl", maxAttempts=1)
    server.admin("POST", "/admin/trace-policies", mode="service", service="lvl-c", level=level)
    msg_id = client.produce("lvl-p", "secret body").json()["result"]["msgId"]
    res = pull_found(client, "lvl")
    assert client.call("/mq/release", requestId=res["requestId"]).status_code == 200

    def dead() -> dict[str, Any] | None:
        paths = traces(server, msgId=msg_id)["paths"]
        hops = {h["hop"]: h for h in paths[0]["hops"]} if paths else {}
        return hops if "dead_lettered" in hops else None

    hops = wait_until(dead, 10, "the dead letter to be traced")
    # A service policy keeps no content (P3) but at debug; the failing node and error type
    # from error on; a description at debug.
    assert ("body" in hops["delivered"]) is kept
    assert ("detail" in hops["dead_lettered"]) is kept
    assert hops["dead_lettered"]["failure"]["cause"] == ("max_attempts" if level != "info" else "error")
    assert hops["dead_lettered"]["status"] == "error"
    client.close()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"mode": "everything"}, "mode"),
        ({"mode": "project"}, "project"),
        ({"mode": "route", "topic": "nope"}, "topic"),
        ({"mode": "project", "project": "nope"}, "project"),
        ({"mode": "queue", "topic": "t"}, "queue"),
        ({"mode": "service", "service": "nobody"}, "service"),
        ({"mode": "route", "topic": "t", "level": "verbose"}, "level"),
        ({"mode": "route", "topic": "t", "project": "default"}, "project"),
    ],
)
def test_bad_policies_are_named(shared_server: Server, body: dict[str, Any], field: str) -> None:
    if not any(t["name"] == "t" for t in shared_server.admin("GET", "/admin/topics")["topics"]):
        shared_server.admin("POST", "/admin/topics", name="t", queues=1)
    h = {"Authorization": f"Bearer {shared_server.admin_token}"}
    r = httpx.post(shared_server.url + "/admin/trace-policies", json=body, headers=h)
    assert r.status_code == 400 and r.json()["result"]["field"] == field, r.text


def test_projects_list_show_and_delete_only_when_empty(server: Server) -> None:
    client = setup(server, "p1", "p1t")
    assert server.admin("GET", "/admin/projects/p1")["topics"] == ["%DLQ%p1t-c", "p1t"]
    h = {"Authorization": f"Bearer {server.admin_token}"}
    r = httpx.delete(server.url + "/admin/projects/p1", headers=h)
    assert r.status_code == 409 and r.json()["result"]["code"] == "in_use", r.text
    for path in ("/admin/producers/p1t-p", "/admin/consumers/p1t-c", "/admin/topics/p1t"):
        assert httpx.delete(server.url + path, headers=h).status_code == 200
    assert httpx.delete(server.url + "/admin/projects/p1", headers=h).status_code == 200
    assert httpx.get(server.url + "/admin/projects/p1", headers=h).status_code == 404
    r = httpx.post(server.url + "/admin/topics", json={"name": "x", "project": "p1"}, headers=h)
    assert r.status_code == 404 and r.json()["result"]["field"] == "project", r.text
    assert httpx.delete(server.url + "/admin/projects/default", headers=h).status_code == 400
    client.close()


def test_a_policy_made_on_one_gateway_traces_on_another(gateways: Any) -> None:  # noqa: F811
    a, b = gateways(refresh_s=60), gateways(refresh_s=60)
    client_b = setup(b, "multi", "mt")
    a.admin("POST", "/admin/trace-policies", mode="route", topic="mt")

    def traced_on_b() -> bool:
        msg_id = client_b.produce("mt-p", "m").json()["result"]["msgId"]
        return bool(traces(a, msgId=msg_id)["paths"])

    wait_until(traced_on_b, 15, "B to trace by A's policy (its refresh is 60 s)", interval_s=0.2)
    client_b.close()


def test_every_hop_of_a_200_survives_kill9(server: Server) -> None:
    client = setup(server, "dur", "dt")
    server.admin("POST", "/admin/trace-policies", mode="project", project="dur")
    ids = [client.produce("dt-p", f"m{i}").json()["result"]["msgId"] for i in range(30)]
    acked: list[str] = []
    for _ in range(3):
        res = client.pull("dt", "dt-c", max=5).json()["result"]
        assert client.call("/mq/ack", requestId=res["requestId"]).status_code == 200
        acked += [m["messageId"] for m in res["msgList"]]
    server.kill9()
    server.start()
    for msg_id in ids:
        found = wait_until(
            lambda m=msg_id: (
                (t := traces(server, msgId=m))["paths"] and not t["mayBeIncomplete"] and t["paths"]
            ),
            10,
            f"the whole trace of {msg_id}",
        )
        hops = {h["hop"] for h in found[0]["hops"]}
        assert {"accepted", "stored"} <= hops
        assert ("acked" in hops) is (msg_id in acked)
    client.close()


def test_the_cli_makes_projects_and_policies_and_finds_paths(server: Server) -> None:
    opts = ["--url", server.url, "--admin-token", server.admin_token]

    def run(*args: str) -> str:
        done = subprocess.run([MQGATE, *args, *opts], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "project cli created" in run("project", "create", "cli", "--description", "from the CLI")
    run("topic", "create", "ct", "--queues", "1", "--project", "cli")
    token = server.admin("POST", "/admin/producers", name="ct-p", topic="ct")["token"]
    policy = run("trace", "add", "route", "--topic", "ct", "--level", "debug").split()[-1]
    assert policy in run("trace", "policies")
    client = Client(server, token, None)
    msg_id = client.produce("ct-p", "via cli", keys=["ck"]).json()["result"]["msgId"]
    out = wait_until(lambda: "stored" in (o := run("trace", "find", "--key", "ck")) and o, 10, "the path")
    assert f"message {msg_id} (cli/ct" in out and "accepted" in out
    assert "verdict" in run("project", "health", "cli")
    assert "deleted" in run("trace", "remove", policy)
    assert run("trace", "policies").strip() == "no policies"
    client.close()


def test_routers_list_queues_by_project_and_topic(shared_server: Server) -> None:
    shared_server.admin("POST", "/admin/projects", name="rp")
    shared_server.admin("POST", "/admin/topics", name="rt", queues=2, maxPriority=1, project="rp")
    found = shared_server.admin("GET", "/admin/routers?project=rp")["routers"]
    assert [(r["id"], r["lane"]) for r in found if r["topic"] == "rt"] == [
        ("rp/rt/0", 0),
        ("rp/rt/1", 0),
        ("rp/rt/2", 1),
        ("rp/rt/3", 1),
    ]
    assert {r["topic"] for r in shared_server.admin("GET", "/admin/routers?topic=rt")["routers"]} == {"rt"}


def test_reads_refused_acks_and_redrives_are_hops(server: Server) -> None:
    client = setup(server, "more", "mo", maxAttempts=1, lockTimeoutS=1)
    server.admin("POST", "/admin/trace-policies", mode="route", topic="mo", level="error")
    msg_id = client.produce("mo-p", "m", keys=["mk"]).json()["result"]["msgId"]
    h = {"Authorization": f"Bearer {client.ctoken}"}
    read = {"topic": "mo", "queue": 0, "offset": 0, "consumer": "mo-c"}
    r = httpx.get(server.url + "/mq/read", params=read, headers=h)
    assert r.status_code == 200, r.text
    res = pull_found(client, "mo")
    assert client.call("/mq/release", requestId=res["requestId"]).status_code == 200
    late = client.call("/mq/ack", requestId=res["requestId"])
    assert late.status_code == 409, late.text  # already settled by the release

    def hops_of(wanted: str) -> list[dict[str, Any]] | None:
        paths = traces(server, msgId=msg_id)["paths"]
        hops = paths[0]["hops"] if paths else []
        return hops if any(x["hop"] == wanted for x in hops) else None

    hops = wait_until(lambda: hops_of("dead_lettered"), 10, "the dead letter")
    assert any(x["hop"] == "read" and x.get("consumer") == "mo-c" for x in hops)
    refused = [x for x in hops if x["hop"] == "acked"]
    assert refused and refused[0]["status"] == "error" and refused[0]["failure"]["cause"]
    assert (
        server.admin("POST", "/admin/consumers/mo-c/dead-letters/redrive", all=True)["redriven"][0][
            "messageId"
        ]
        == msg_id
    )
    hops = wait_until(lambda: hops_of("redriven"), 10, "the redrive")
    assert [x["hop"] for x in hops].index("dead_lettered") < [x["hop"] for x in hops].index("redriven")
    client.close()


def test_queue_state_is_recorded_per_project_and_interval(tmp_path: Any) -> None:
    srv = Server(
        tmp_path / "data",
        env={"MQGATE_QUEUE_STATE_INTERVAL_S": "1", "MQGATE_QUEUE_STATE_SAMPLE_S": "0.1"},
    )
    srv.start()
    try:
        client = setup(srv, "qs", "qt")
        for i in range(7):
            assert client.produce("qt-p", f"m{i}").status_code == 200

        def recorded() -> list[dict[str, Any]]:
            rows = srv.admin("GET", "/admin/projects/qs/queues?topic=qt")["intervals"]
            return [r for r in rows if r.get("maxLength") == 7 and r["avgLength"] > 0]

        rows = wait_until(recorded, 15, "a closed interval with the backlog")
        assert rows[0]["topic"] == "qt" and rows[0]["queue"] == 0 and rows[0]["intervalMs"] == 1000
        health = srv.admin("GET", "/admin/projects/qs/health")
        assert health["project"] == "qs" and health["verdict"] in ("healthy", "consumer_fault", "no_data")
        client.close()
    finally:
        srv.stop()


def test_a_trace_topic_reads_like_any_topic(server: Server) -> None:
    client = setup(server, "rd", "rdt")
    server.admin("POST", "/admin/trace-policies", mode="project", project="rd")
    msg_id = client.produce("rdt-p", "x").json()["result"]["msgId"]
    bounds = server.admin("GET", "/mq/bounds?topic=%25TRACE%25rd")
    assert bounds["queues"][0]["max"] == 1, bounds  # one record: the accepted and stored hops
    read = server.admin("GET", "/mq/read?topic=%25TRACE%25rd&queue=0&offset=0&max=10")["msgList"]
    assert read[0]["tags"] == ["batch"]
    held = json.loads(read[0]["message"])
    assert held["kind"] == "batch" and held["msgIds"] == [msg_id] and held["hops"] == ["accepted", "stored"]
    token = server.admin("POST", "/admin/consumers", name="trace-reader", topic="%TRACE%rd")["token"]
    reader = Client(server, None, token)
    res = reader.pull("%TRACE%rd", "trace-reader", max=10).json()["result"]
    assert res["status"] == "FOUND" and len(res["msgList"]) == 1
    reader.call("/mq/ack", requestId=res["requestId"])
    # Reading and consuming the trace topic traced nothing more (it would trace itself).
    after = server.admin("GET", "/mq/bounds?topic=%25TRACE%25rd")["queues"][0]["max"]
    assert after == bounds["queues"][0]["max"], (after, bounds)
    reader.close()
    client.close()


def test_a_refused_produce_is_traced_as_failed_and_found_by_its_key(server: Server) -> None:
    client = setup(server, "refused", "rf")
    server.admin("POST", "/admin/trace-policies", mode="project", project="refused", level="error")
    r = client.produce("rf-p", "too high", keys=["bad-7"], priority=5)  # the topic has no lanes
    assert r.status_code == 400, r.text
    code = r.json()["result"]["code"]

    def failed() -> dict[str, Any] | None:
        found = traces(server, key="bad-7")
        return found if found["paths"] and not found["mayBeIncomplete"] else None

    [path] = wait_until(failed, 15, "the refused produce to be traced")["paths"]
    [hop] = path["hops"]
    assert hop["hop"] == "failed" and hop["status"] == "error", hop
    assert hop["failure"]["cause"] == code and hop["failure"]["node"], hop
    assert path["failures"] and path["keys"] == ["bad-7"]
    client.close()
