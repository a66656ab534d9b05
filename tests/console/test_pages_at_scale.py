"""Long lists in pages, with a find box, and the overview's consumers with the most lag, over
HTTP against a real gateway with the console (more topics and consumers than a page shows)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest import wait_until
from tests.console.conftest import ConsoleServer, sign_in


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleServer]:
    srv = ConsoleServer(tmp_path_factory.mktemp("crowded") / "data")
    srv.data_dir.mkdir(parents=True)
    srv.add_user("admin", "admin")
    srv.start()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: srv.admin("POST", "/admin/topics", name=f"t{i:03d}", queues=1), range(120)))
        list(pool.map(lambda i: srv.admin("POST", "/admin/consumers", name=f"t{i:03d}-c", topic=f"t{i:03d}",
                                           start="earliest"), range(60)))  # fmt: skip
    yield srv
    srv.stop()


def rows(html: str, table: str, attribute: str) -> list[str]:
    body = html[html.index(f'<table id="{table}"') :]
    body = body[: body.index("</table>")]
    return re.findall(rf'<tr {attribute}="([^"]+)"', body)


def test_topics_in_pages_with_find(crowded: ConsoleServer) -> None:
    client = sign_in(crowded, "admin")
    first = client.get("/console/topics")
    assert rows(first.text, "topics", "data-topic") == [f"t{i:03d}" for i in range(100)]
    assert "Topics 1–100 of 120 (page 1 of 2)" in first.text and 'rel="next"' in first.text
    last = client.get("/console/topics", params={"page": "last"})
    assert rows(last.text, "topics", "data-topic") == [f"t{i:03d}" for i in range(100, 120)]
    assert (
        rows(client.get("/console/topics?page=9").text, "topics", "data-topic")[0] == "t100"
    )  # past the end
    found = client.get("/console/topics", params={"q": "T11"})
    assert rows(found.text, "topics", "data-topic") == [f"t11{i}" for i in range(10)]
    assert "page 1 of" not in found.text  # one page: no pager
    bad = client.get("/console/topics", params={"page": "0"})
    assert bad.status_code == 400 and "page is a page number" in bad.text


def test_consumers_and_producers_in_pages_keep_the_find(crowded: ConsoleServer) -> None:
    client = sign_in(crowded, "admin")
    page = client.get("/console/clients")
    assert len(rows(page.text, "consumers", "data-consumer")) == 50
    assert "Consumers 1–50 of 60 (page 1 of 2)" in page.text
    second = client.get("/console/clients", params={"page": "2"})
    assert rows(second.text, "consumers", "data-consumer") == [f"t{i:03d}-c" for i in range(50, 60)]
    found = client.get("/console/clients", params={"q": "t05"})
    assert rows(found.text, "consumers", "data-consumer") == [f"t05{i}-c" for i in range(10)]
    narrowed = client.get("/console/clients", params={"q": "t0"})  # all 60 match: two pages
    assert 'href="?q=t0&amp;page=2" rel="next"' in narrowed.text  # the next page keeps the find


def test_overview_lists_the_consumers_with_the_most_lag(crowded: ConsoleServer) -> None:
    ptoken = crowded.admin("POST", "/admin/producers", name="t059-p", topic="t059")["token"]
    batch = {"producer": "t059-p", "messages": [{"message": "x"}] * 3}
    r = httpx.post(crowded.url + "/mq/produce/batch", json=batch,
                   headers={"Authorization": f"Bearer {ptoken}"}, timeout=10)  # fmt: skip
    assert r.status_code == 200, r.text
    client = sign_in(crowded, "admin")

    def first_row() -> str:
        html = client.get("/console/live/overview").text
        return re.findall(r'data-lag="([^"]+)">(\d+)<', html)[0]

    # Ranked by the lag gauges (a pass at least every 10 s); its figures are read at once.
    assert wait_until(lambda: first_row() == ("t059-c", "3") and first_row(), 20, "t059-c at the top")
    html = client.get("/console/").text
    assert "The 25 of 60 consumers with the most lag" in html and "35 more consumers not shown" in html


def test_the_project_page_lists_its_topics_in_pages(crowded: ConsoleServer) -> None:
    """The default project's page with 10,000 topics was one 979 kB page (every topic twice: a
    chip and an option of the queue-state filter); now a page of them, with the pager."""
    client = sign_in(crowded, "admin")
    chips = r'<a class="chip" href="/console/messages\?topic=(t\d+)">'
    first = client.get("/console/projects/default")
    assert first.status_code == 200
    assert re.findall(chips, first.text) == [f"t{i:03d}" for i in range(100)]
    assert "Topics 1–100 of 120" in first.text
    last = client.get("/console/projects/default", params={"topics_page": "2"})
    assert re.findall(chips, last.text) == [f"t{i:03d}" for i in range(100, 120)]
    filtered = client.get("/console/projects/default", params={"topic": "t119", "topics_page": "2"})
    assert 'name="topic" list="project-topics" value="t119"' in filtered.text


def test_the_projects_page_lists_projects_in_pages(crowded: ConsoleServer) -> None:
    """Every project a viewer may see was one row of one page, each with its topics found by a
    pass over every topic; now pages of 50."""
    names = [f"p{i:02d}" for i in range(55)]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda n: crowded.admin("POST", "/admin/projects", name=n), names))
    crowded.admin("POST", "/admin/topics", name="p54-t", queues=1, project="p54")
    client = sign_in(crowded, "admin")
    first = client.get("/console/projects")
    assert first.status_code == 200
    assert rows(first.text, "projects", "data-project") == ["default", *names[:49]]
    assert "Projects 1–50 of 56 (page 1 of 2)" in first.text
    last = client.get("/console/projects", params={"page": "2"})
    assert rows(last.text, "projects", "data-project") == names[49:]
    assert '<span class="chip">p54-t</span>' in last.text
