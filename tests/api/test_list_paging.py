"""Every admin list that grows with what is registered is answered in pages (issue 27, "bounded
everywhere"): topics, consumers, producers, projects, routers, trace policies, clusters, the
active alerts and a broadcast consumer's progress rows. On a real gateway with a small answer
budget each page's items stay within `max_answer_bytes` (at least one), `limit` caps a page
(1-10,000, else 400 naming it), `next` is there while items are left and absent on the last
page, and following it reaches every item once, in the list's order, whatever the page size.
A cursor the list did not give (garbage, made up, another list's or another query's) is a 400
naming `cursor`, never a 500."""

from __future__ import annotations

import base64
import random
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest

from tests.conftest import Server

BUDGET = 800
TOPICS = [f"t{i:02}" for i in range(16)]
PROJECTS = [f"p{i:02}" for i in range(20)]
CLUSTERS = [f"c{i}" for i in range(6)]
ALERTING = TOPICS[:10]  # their consumers' lag is over their alert threshold
CLIENTS = [f"client-{i:02}" for i in range(20)]  # of the broadcast consumer

# Each list: its path, the field holding its items, what names an item (its key in the list).
LISTS: dict[str, tuple[str, str, Any]] = {
    "topics": ("/admin/topics", "topics", lambda t: t["name"]),
    "consumers": ("/admin/consumers", "consumers", lambda c: c["name"]),
    "producers": ("/admin/producers", "producers", lambda p: p["name"]),
    "projects": ("/admin/projects", "projects", lambda p: p["name"]),
    "routers": ("/admin/routers", "routers", lambda r: (r["topic"], r["queue"])),
    "policies": ("/admin/trace-policies", "policies", lambda p: p["id"]),
    "clusters": ("/admin/clusters", "clusters", lambda c: c["name"]),
    "alerts": ("/admin/alerts", "active", lambda a: a["key"]),
    "progress": (
        "/admin/consumers/bc/progress",
        "queues",
        lambda q: (q.get("clientId"), q["source"], q["queue"]),
    ),
}


class Gateway:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.http = httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {server.admin_token}"}, timeout=30
        )

    def get(self, path: str, **params: Any) -> httpx.Response:
        return self.http.get(path, params={k: v for k, v in params.items() if v is not None})

    def pages(self, name: str, **params: Any) -> list[dict[str, Any]]:
        """Every page of a list, following `next`; each page's items within the budget."""
        path, field, _ = LISTS[name]
        out = []
        cursor = None
        while True:
            r = self.get(path, cursor=cursor, **params)
            assert r.status_code == 200, r.text
            result = r.json()["result"]
            items = result[field]
            size = len(msgspec.json.encode(items))
            if name == "alerts":  # a backlog alert is in `alerts` too, counted with it
                size += len(msgspec.json.encode(result["alerts"]))
            assert size <= BUDGET + 2 or len(items) == 1, (name, size)
            out.append(result)
            cursor = result.get("next")
            if cursor is None:
                return out
            assert items, "a page with a next page holds at least one item"
            assert len(out) < 1000, "the cursor does not move"

    def whole(self, name: str, **params: Any) -> list[Any]:
        _, field, _ = LISTS[name]
        return [item for page in self.pages(name, **params) for item in page[field]]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp("lists")
    srv = Server(root / "data", env={"MQGATE_MAX_ANSWER_BYTES": str(BUDGET)}).start()
    try:
        g = Gateway(srv)
        for name in PROJECTS:
            srv.admin("POST", "/admin/projects", name=name)
            srv.admin("POST", "/admin/trace-policies", mode="project", project=name, level="info")
        tokens = {}
        for i, topic in enumerate(TOPICS):
            tokens[topic] = srv.setup_topic(topic, queues=1 + i % 4)[0]
        srv.admin("POST", "/admin/consumers", name="bc", topic="t00", mode="broadcast")
        for topic in ALERTING:
            srv.admin("POST", f"/admin/consumers/{topic}-c/alert", backlog=1)
            for body in ("a", "b"):
                r = httpx.post(
                    srv.url + "/mq/produce",
                    json={"producer": f"{topic}-p", "message": body},
                    headers={"Authorization": f"Bearer {tokens[topic]}"},
                )
                assert r.status_code == 200, r.text
        ctoken = srv.admin("POST", "/admin/consumers/bc/token")["token"]
        for client in CLIENTS:
            r = httpx.get(
                srv.url + "/mq/message",
                params={"topic": "t00", "consumer": "bc", "clientId": client, "max": 1},
                headers={"Authorization": f"Bearer {ctoken}"},
            )
            assert r.status_code == 200, r.text
        for name in CLUSTERS:
            srv.admin("POST", "/admin/clusters", name=name, url=f"embedded:{root / name}")
        yield g
        g.http.close()
    finally:
        srv.stop()


@pytest.mark.parametrize("name", sorted(LISTS))
def test_a_list_pages_within_the_budget_and_reaches_every_item_once(gw: Gateway, name: str) -> None:
    _, field, key = LISTS[name]
    pages = gw.pages(name)
    assert len(pages) > 1, "the list is more than one answer's budget"
    assert all("next" in p for p in pages[:-1]) and "next" not in pages[-1]
    items = [item for page in pages for item in page[field]]
    keys = [key(item) for item in items]
    assert len(set(keys)) == len(keys), "an item came twice"
    small = [key(item) for item in gw.whole(name, limit=3)]
    assert small == keys  # another page size, the same items in the same order
    assert all(len(page[field]) <= 3 for page in gw.pages(name, limit=3))
    one = gw.pages(name, limit=1)
    assert len(one) == len(keys)


def test_each_list_holds_what_was_registered(gw: Gateway) -> None:
    topics = gw.whole("topics")
    names = [t["name"] for t in topics]
    assert names == sorted(names) and set(TOPICS) <= set(names)
    assert {f"{t}-c" for t in TOPICS} | {"bc"} <= {c["name"] for c in gw.whole("consumers")}
    assert [p["name"] for p in gw.whole("producers")] == [f"{t}-p" for t in TOPICS]
    assert [p["name"] for p in gw.whole("projects")] == sorted(["default", *PROJECTS])
    assert sorted(p["project"] for p in gw.whole("policies")) == PROJECTS
    assert [c["name"] for c in gw.whole("clusters")] == CLUSTERS
    # Every queue of every topic of the default project, in (topic, queue) order.
    lanes = [(t["name"], q) for t in topics if t["project"] == "default" for q in range(t["queues"])]
    routers = [(r["topic"], r["queue"]) for r in gw.whole("routers", project="default")]
    assert routers == lanes and len(routers) > 30
    alerts = gw.pages("alerts")
    assert [a["key"] for p in alerts for a in p["active"]] == sorted(f"lag:{t}-c" for t in ALERTING)
    assert [a["consumer"] for p in alerts for a in p["alerts"]] == sorted(f"{t}-c" for t in ALERTING)
    # The broadcast consumer: a row per clientId and queue, by clientId, its totals on every page.
    pages = gw.pages("progress")
    rows = [(q["clientId"], q["source"], q["queue"]) for p in pages for q in p["queues"]]
    assert [c for c, _, _ in rows] == sorted(c for c, _, _ in rows)
    assert {c for c, _, _ in rows} == set(CLIENTS)
    per_client = len(rows) // len(CLIENTS)
    assert per_client >= 1 and len(rows) == per_client * len(CLIENTS)
    assert {p["lag"] for p in pages} == {pages[0]["lag"]} and {p["consumer"] for p in pages} == {"bc"}


def cursors(gw: Gateway) -> dict[str, str]:
    """A first page's `next` of each list."""
    out = {}
    for name, (path, _, _) in LISTS.items():
        r = gw.get(path, limit=1)
        assert r.status_code == 200, r.text
        out[name] = r.json()["result"]["next"]
    return out


def test_a_cursor_the_list_did_not_give_is_a_400_naming_it(gw: Gateway) -> None:
    rng = random.Random(27)
    given = cursors(gw)
    b64 = base64.urlsafe_b64encode
    made_up = [
        "!!", "AAAA", "é", "x" * 3000, "=", "-_-_", b64(b"[]").decode(), b64(b'["x"]').decode(),
        b64(b'{"a":1}').decode(), b64(b'["abc",null]').decode(), b64(b'["abc","t00",1e400]').decode(),
        b64(b'["abc","t00",99999999999999999999999]').decode(),
    ]  # fmt: skip
    for _ in range(40):
        made_up.append(b64(rng.randbytes(rng.randrange(1, 60))).decode().rstrip("="))
        parts = [rng.choice(["x", 1, -5, None, 2**70, "t00", [], {}, 1.5]) for _ in range(rng.randrange(4))]
        made_up.append(b64(msgspec.json.encode(["tag", *parts])).decode())
    for name, (path, _, _) in LISTS.items():
        cursor = given[name]
        refused = [*made_up, cursor[:-2], cursor + "A", *[c for n, c in given.items() if n != name]]
        for bad in refused:
            r = gw.get(path, cursor=bad)
            assert r.status_code == 400, (name, bad, r.text)
            assert r.json()["result"] == {"code": "bad_request", "field": "cursor"}, (name, bad, r.text)
        for limit in (0, -1, 10_001, "many"):
            r = gw.get(path, limit=limit)
            assert r.status_code == 400, (name, limit, r.text)
            assert r.json()["result"]["field"] == "limit"
        assert gw.get(path, cursor=cursor).status_code == 200
    # A cursor goes back only with the query it was given for.
    first = gw.get("/admin/routers", project="default", limit=2).json()["result"]["next"]
    assert gw.get("/admin/routers", project="default", cursor=first).status_code == 200
    r = gw.get("/admin/routers", project="p00", cursor=first)
    assert (r.status_code, r.json()["result"]["field"]) == (400, "cursor")


def test_the_openapi_document_shows_the_paging_parameters(gw: Gateway) -> None:
    doc = httpx.get(gw.server.url + "/openapi.json", timeout=30).json()
    for path, field, _ in LISTS.values():
        template = path.replace("/bc/", "/{name}/")
        op = doc["paths"][template]["get"]
        params = {p["name"]: p["schema"] for p in op["parameters"]}
        assert params["limit"]["maximum"] == 10_000 and params["limit"]["minimum"] == 1, path
        assert "cursor" in params, path
        answer = op["responses"]["200"]["content"]["application/json"]["schema"]["properties"]["result"]
        name = answer["$ref"].rsplit("/", 1)[1]
        assert "next" in doc["components"]["schemas"][name]["properties"], path
        assert field in doc["components"]["schemas"][name]["properties"], path


def test_a_reset_answers_a_page_of_the_progress_and_of_the_clamped_offsets(gw: Gateway) -> None:
    """A reset answered the broadcast consumer's whole progress and every clamped offset (a row
    per clientId and queue each): now the first page of the progress, within the budget, whose
    `next` goes on with the progress list, and the clamped offsets that fit, with their count."""
    r = gw.http.post("/admin/consumers/bc/reset", json={"to": "offset", "offset": 10**9})
    assert r.status_code == 200, r.text
    result = r.json()["result"]
    assert len(msgspec.json.encode(result["queues"])) <= BUDGET + 2
    assert len(msgspec.json.encode(result["clamped"])) <= BUDGET + 2
    every = [(q["clientId"], q["source"], q["queue"]) for q in gw.whole("progress")]
    assert result["clampedCount"] == len(every) and 1 <= len(result["clamped"]) < len(every)
    rows = [(q["clientId"], q["source"], q["queue"]) for q in result["queues"]]
    cursor = result["next"]
    while cursor is not None:
        page = gw.get("/admin/consumers/bc/progress", cursor=cursor).json()["result"]
        rows += [(q["clientId"], q["source"], q["queue"]) for q in page["queues"]]
        cursor = page.get("next")
    assert rows == every and {c for c, _, _ in rows} == set(CLIENTS)  # each row once
