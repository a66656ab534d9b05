"""A project's answer names at most 100 of its topics (issue 27, "bounded everywhere": a project
with 10,000 topics answered every name, in every project of a listing); how many it has is
`topicCount`, and all of them are `GET /admin/topics?project=<name>`, in pages like every list.
On a real gateway with 130 topics in one project, 3 in another and a trace policy (whose
`%TRACE%` topic is the project's own, not one of its topics)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from mqgate.cli.project import named_topics
from tests.conftest import Server

BIG = [f"b{i:03d}" for i in range(130)]
SMALL = ["s0", "s1", "s2"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("project-topics") / "data").start()
    try:
        srv.admin("POST", "/admin/projects", name="big")
        srv.admin("POST", "/admin/projects", name="small")
        srv.admin("POST", "/admin/trace-policies", mode="project", project="big", level="info")
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda t: srv.admin("POST", "/admin/topics", name=t, queues=1, project="big"), BIG))
        for t in SMALL:
            srv.admin("POST", "/admin/topics", name=t, queues=1, project="small")
        srv.admin("POST", "/admin/topics", name="d0", queues=1)
        yield srv
    finally:
        srv.stop()


def get(srv: Server, path: str, **params: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {srv.admin_token}"}
    return httpx.get(srv.url + path, params=params, headers=headers, timeout=30)


def test_a_project_names_its_first_100_topics_and_counts_them_all(server: Server) -> None:
    big = get(server, "/admin/projects/big").json()["result"]
    assert big["topics"] == BIG[:100] and big["topicCount"] == 130
    small = get(server, "/admin/projects/small").json()["result"]
    assert small["topics"] == SMALL and small["topicCount"] == 3
    listed = {p["name"]: p for p in get(server, "/admin/projects").json()["result"]["projects"]}
    assert listed["big"] == big and listed["small"] == small
    assert listed["default"]["topics"] == ["d0"] and listed["default"]["topicCount"] == 1
    assert named_topics(big).endswith(",b099 and 30 more") and named_topics(small) == "s0,s1,s2"


def test_the_topics_of_a_project_in_pages(server: Server) -> None:
    names: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"project": "big", "limit": 40}
        if cursor is not None:
            params["cursor"] = cursor
        r = get(server, "/admin/topics", **params)
        assert r.status_code == 200, r.text
        page = r.json()["result"]
        assert {t["project"] for t in page["topics"]} == {"big"}
        names += [t["name"] for t in page["topics"]]
        pages += 1
        cursor = page.get("next")
        if cursor is None:
            break
    assert names == BIG and pages == 4  # the trace topic %TRACE%big is not one of them
    every = [t["name"] for t in get(server, "/admin/topics").json()["result"]["topics"]]
    assert "%TRACE%big" in every and set(BIG) | set(SMALL) | {"d0"} <= set(every)
    # A cursor goes back only with the project it was given for.
    first = get(server, "/admin/topics", project="big", limit=2).json()["result"]["next"]
    r = get(server, "/admin/topics", project="small", cursor=first)
    assert (r.status_code, r.json()["result"]["field"]) == (400, "cursor")


def test_an_unknown_or_bad_project_is_refused_naming_it(server: Server) -> None:
    r = get(server, "/admin/topics", project="nope")
    assert r.status_code == 404 and r.json()["result"]["field"] == "project", r.text
    r = get(server, "/admin/topics", project="bad name!")
    assert r.status_code == 400 and r.json()["result"]["field"] == "project", r.text
    # The answers the route can give are in its document (schemathesis found the 404 missing).
    document = httpx.get(server.url + "/openapi.json", timeout=30).json()
    assert {"200", "400", "404"} <= set(document["paths"]["/admin/topics"]["get"]["responses"])
