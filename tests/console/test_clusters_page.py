"""The clusters page, the fail-back with its preview and the project page's "Where it lives",
over HTTP against a real gateway with the console: on the embedded default (no clusters) and
on two real redis-servers of the test's own as a project's primary and backup, the primary
hung by SIGSTOP to make the project fail over."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import wait_until
from tests.console.conftest import ConsoleServer, csrf_of, sign_in
from tests.failover.conftest import FailoverRedis

# Starts a gateway and two redis-servers: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

QUEUES = 3
# Short failover thresholds, as tests/failover/test_gateway_failover.py: a hung primary is
# failed within about a second, a resumed one healthy again within half a second.
FAST = {
    "MQGATE_FAILOVER_SEND_TIMEOUT_S": "1.0",
    "MQGATE_FAILOVER_PROBE_INTERVAL_S": "0.1",
    "MQGATE_FAILOVER_PROBE_TIMEOUT_S": "0.3",
    "MQGATE_FAILOVER_CHECK_S": "0.2",
    "MQGATE_FAILOVER_REJOIN_PROBES": "3",
}


def clustered_console(root: Path) -> tuple[ConsoleServer, FailoverRedis, FailoverRedis]:
    primary = FailoverRedis(root / "primary").start()
    backup = FailoverRedis(root / "backup").start()
    srv = ConsoleServer(root / "data", env=dict(FAST))
    srv.data_dir.mkdir(parents=True)
    srv.add_user("admin", "admin")
    srv.start()
    srv.admin("POST", "/admin/clusters", name="p", url=primary.url, pool="main")
    srv.admin("POST", "/admin/clusters", name="b", url=backup.url, pool="main")
    return srv, primary, backup


@pytest.fixture(scope="module")
def clustered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ConsoleServer, FailoverRedis]]:
    srv, primary, backup = clustered_console(tmp_path_factory.mktemp("clusters"))
    yield srv, primary
    srv.stop()
    primary.stop()
    backup.stop()


def failover_of(srv: ConsoleServer, project: str) -> dict[str, Any]:
    result: dict[str, Any] = srv.admin("GET", f"/admin/projects/{project}/failover")
    return result


def cluster_state(srv: ConsoleServer, name: str) -> str:
    return str(srv.admin("GET", f"/admin/clusters/{name}")["state"])


def entry(page: str, project: str) -> str:
    """The project's entry on the clusters page."""
    start = page.index(f'id="project-{project}"')
    return page[start : page.index("</article>", start)]


def where_section(page: str) -> str:
    """The project page's "Where it lives"."""
    start = page.index('id="where"')
    return page[start : page.index("</section>", start)]


def cells(page: str, css_class: str) -> list[str]:
    return [html.unescape(x) for x in re.findall(rf'<td class="num {css_class}"[^>]*>([^<]*)</td>', page)]


# --- the embedded default: one store, no clusters --------------------------------------------


def test_embedded_default_explains_the_one_store_and_how_to_add_clusters(console: ConsoleServer) -> None:
    client = sign_in(console, "admin")
    r = client.get("/console/clusters")
    assert r.status_code == 200, r.text
    assert 'id="no-clusters"' in r.text
    assert f"the embedded store in {console.data_dir}" in r.text
    assert "mqgate cluster add" in r.text and "mqgate cluster assign" in r.text
    assert "docs/FAILOVER.md" in r.text and "MQGATE_FAILOVER_CLUSTERS" in r.text
    assert 'aria-current="page">Clusters' in r.text  # the nav link names this page

    project = client.get("/console/projects/default")
    assert project.status_code == 200, project.text
    where = where_section(project.text)
    assert "no clusters are configured, so it cannot fail over" in where
    assert "How to add clusters" in where


def test_clusters_page_is_for_admins_only(console: ConsoleServer) -> None:
    console.add_user("vera", "viewer", "default")
    client = sign_in(console, "vera")
    r = client.get("/console/clusters")
    assert r.status_code == 403 and "admin role" in r.text
    assert ">Clusters</a>" not in client.get("/console/").text  # no nav link either
    where = where_section(client.get("/console/projects/default").text)
    assert "the embedded store" in where and str(console.data_dir) not in where  # no path for viewers
    assert "How to add clusters" not in where
    preview = client.post(
        "/console/clusters/projects/default/failback/preview", data={"csrf": csrf_of(client)}
    )
    assert preview.status_code == 403


# --- two Redis clusters, a failover and a fail-back ------------------------------------------


def test_failover_shows_and_failback_moves_the_project_back(
    clustered: tuple[ConsoleServer, FailoverRedis],
) -> None:
    srv, primary = clustered
    srv.admin("POST", "/admin/projects", name="shop")
    srv.admin("PUT", "/admin/projects/shop/clusters", primary="p", backup="b")
    srv.admin("POST", "/admin/topics", name="orders", queues=QUEUES, project="shop")
    ptoken = srv.admin("POST", "/admin/producers", name="orders-p", topic="orders")["token"]
    srv.admin("POST", "/admin/consumers", name="orders-c", topic="orders", start="earliest")
    wait_until(lambda: failover_of(srv, "shop")["active"] == "p", 10, "shop active on p")

    def produce(n: int, tag: str) -> None:
        body = {"producer": "orders-p", "messages": [{"message": f"{tag}-{i}"} for i in range(n)]}
        r = httpx.post(srv.url + "/mq/produce/batch", json=body,
                       headers={"Authorization": f"Bearer {ptoken}"}, timeout=30)  # fmt: skip
        assert r.status_code == 200, r.text

    produce(4, "before")
    client = sign_in(srv, "admin")

    # On its primary: both clusters healthy with a formatted latency, no fail-back offered.
    page = client.get("/console/clusters")
    assert page.status_code == 200, page.text
    assert 'data-pool="main"' in page.text and "Pool main" in page.text
    assert re.search(r'data-cluster="p">.*?data-state="healthy"', page.text, re.S)
    latencies = cells(page.text, "latency")
    formatted = r"[\d,]+\.\d{1,2} ms|[\d,]+ ms|<0\.01 ms"  # formats.millis: never 4.999999999881766
    assert len(latencies) == 2 and all(re.fullmatch(formatted, x) for x in latencies), latencies
    assert "last 300 probes" in page.text
    history = re.search(r'data-history="p">.*?class="probe-summary">([^<]*)<', page.text, re.S)
    assert history is not None and re.match(
        r"\d+ probes? since .*: 0 failures; latency median", history.group(1)
    ), history
    assert re.search(r'data-history="p">.*?<tr class="ok"><td>[^<]+</td><td>ok</td>', page.text, re.S)
    shop = entry(page.text, "shop")
    assert 'class="active">p (healthy)' in shop and 'class="epoch">1<' in shop
    assert "on its primary" in shop and "failback/preview" not in shop
    assert re.findall(r'data-epoch="(\d+)"', shop) == ["1"]

    # The primary hangs: the project moves to its backup.
    primary.pause()
    try:
        wait_until(lambda: failover_of(srv, "shop")["active"] == "b", 20, "shop failed over to b")
        page = client.get("/console/clusters")
        assert re.search(r'data-cluster="p">.*?data-state="failed"', page.text, re.S)
        shop = entry(page.text, "shop")
        assert "failed over to b" in shop and 'class="active">b (healthy)' in shop
        assert 'class="epoch">2<' in shop
        assert re.findall(r'data-epoch="(\d+)"', shop) == ["1", "2"]  # oldest first
        assert "p → b" in shop and 'class="hop failed" data-epoch="2"' in shop
        assert "failback/preview" in shop

        # A preview while the primary is down warns that it would not hold.
        csrf = csrf_of(client, "/console/clusters")
        early = client.post("/console/clusters/projects/shop/failback/preview", data={"csrf": csrf})
        assert early.status_code == 200 and 'id="primary-warning"' in early.text
        assert "p is failed: not measured" in early.text
    finally:
        primary.resume()

    produce(5, "after")
    # p rejoins; what its consumer had not consumed there is drained into its inbox on b.
    wait_until(lambda: cluster_state(srv, "p") == "healthy", 20, "p healthy again")
    wait_until(lambda: failover_of(srv, "shop")["draining"] == [], 20, "p drained")
    assert failover_of(srv, "shop")["active"] == "b"  # no automatic fail-back
    lag = srv.admin("GET", "/admin/consumers/orders-c/progress")["lag"]
    assert lag == 9

    # The preview says what moves, from where to where.
    assert client.post("/console/clusters/projects/shop/failback/preview").status_code == 403  # no CSRF
    preview = client.post("/console/clusters/projects/shop/failback/preview", data={"csrf": csrf})
    assert preview.status_code == 200, preview.text
    text = preview.text
    assert re.search(r'id="from">b<.*id="to">p<', text, re.S)
    assert 'id="primary-warning"' not in text
    assert re.search(r'id="topic-count">1<', text) and re.search(rf'id="queue-count">{QUEUES}<', text)
    assert re.search(r'id="spooled">0<', text)
    assert re.search(r'id="to-drain">9<', text)
    assert cells(text, "source") == ["9"] and cells(text, "target") == ["0"]  # p was drained
    assert 'name="epoch" value="2"' in text
    assert failover_of(srv, "shop")["active"] == "b"  # a preview changes nothing

    # Refused: without the confirmation, and against a preview of another move.
    unconfirmed = client.post("/console/clusters/projects/shop/failback", data={"csrf": csrf, "epoch": "2"})
    assert unconfirmed.status_code == 400 and "confirmation" in unconfirmed.text
    stale = client.post(
        "/console/clusters/projects/shop/failback", data={"csrf": csrf, "confirmed": "yes", "epoch": "1"}
    )
    assert stale.status_code == 409 and "moved since the preview" in stale.text
    assert failover_of(srv, "shop")["active"] == "b"

    done = client.post(
        "/console/clusters/projects/shop/failback", data={"csrf": csrf, "confirmed": "yes", "epoch": "2"}
    )
    assert done.status_code == 303, done.text
    assert "/console/clusters?project=shop" in done.headers["location"]
    state = failover_of(srv, "shop")
    assert (state["active"], state["epoch"], state["reason"]) == ("p", 3, "manual fail-back")

    after = client.get(done.headers["location"])
    assert "failed back from b to p (epoch 3)" in after.text
    shop = entry(after.text, "shop")
    assert 'class="cluster-project target" id="project-shop"' in after.text
    assert re.findall(r'data-epoch="(\d+)"', shop) == ["1", "2", "3"]
    assert "b → p" in shop and "manual fail-back" in shop and "failback/preview" not in shop
    again = client.post(
        "/console/clusters/projects/shop/failback", data={"csrf": csrf, "confirmed": "yes", "epoch": "3"}
    )
    assert again.status_code == 400 and "on its primary p already" in again.text
    nothing = client.post("/console/clusters/projects/shop/failback/preview", data={"csrf": csrf})
    assert nothing.status_code == 200 and "There is nothing to fail back" in nothing.text
    assert 'id="confirm-failback"' not in nothing.text
    unknown = client.post("/console/clusters/projects/nowhere/failback/preview", data={"csrf": csrf})
    assert unknown.status_code == 404 and "has no clusters" in unknown.text

    audit = client.get("/console/audit", params={"action": "project.failback"}).text
    rows = re.findall(r'<td class="action">project\.failback</td><td>shop</td><td>shop</td>', audit)
    assert len(rows) == 1, audit

    # The project page says where it lives and links to its entry.
    project = client.get("/console/projects/shop").text
    where = where_section(project)
    assert "Pool <strong>main</strong>" in where and "primary <strong>p</strong>" in where
    assert "backup <strong>b</strong>" in where and 'id="where-active">p<' in where and "epoch 3" in where
    assert 'href="/console/clusters?project=shop#project-shop"' in where

    # Whoever may see the project (not the clusters page) reads its last switch and timeline.
    srv.add_user("vera", "viewer", "shop")
    viewer = sign_in(srv, "vera")
    assert viewer.get("/console/clusters").status_code == 403
    where = where_section(viewer.get("/console/projects/shop").text)
    last = re.search(r'id="last-switch">(.*?)</p>', where, re.S)
    assert last is not None, where
    assert "b → p" in last.group(1) and "(epoch 3)" in last.group(1) and "manual fail-back" in last.group(1)
    assert re.search(r"\d{4}-\d\d-\d\d", last.group(1)), last.group(1)  # when
    assert re.findall(r'data-epoch="(\d+)"', where) == ["3", "2", "1"]  # newest first
    assert re.search(r'data-epoch="2">\s*<span class="hop-name">p → b<', where), where
    assert "/console/clusters" not in where


def test_project_page_for_a_viewer_names_the_clusters_without_the_link(
    clustered: tuple[ConsoleServer, FailoverRedis],
) -> None:
    srv, _ = clustered
    srv.admin("POST", "/admin/projects", name="pay")
    srv.admin("PUT", "/admin/projects/pay/clusters", primary="b", backup="p")
    srv.add_user("olga", "viewer", "pay")
    wait_until(lambda: failover_of(srv, "pay")["active"] == "b", 10, "pay active on b")
    client = sign_in(srv, "olga")
    page = client.get("/console/projects/pay").text
    where = where_section(page)
    assert "primary <strong>b</strong>" in where and 'id="where-active">b<' in where
    assert "/console/clusters" not in where
    assert client.get("/console/clusters").status_code == 403
    # A project of the same gateway without clusters lives in its own store.
    srv.admin("POST", "/admin/projects", name="local")
    admin = sign_in(srv, "admin")
    local = admin.get("/console/projects/local").text
    assert "Not on a cluster: its messages are in the gateway's own store, the embedded store in" in local
    # The API's cluster changes are audited by name, under the project they change.
    audit = admin.get("/console/audit", params={"project": "pay"}).text
    assert re.search(r'<td class="action">project\.clusters</td><td>pay</td><td>pay</td>', audit), audit
    added = admin.get("/console/audit", params={"action": "cluster.add"}).text
    assert re.findall(r'<td class="action">cluster\.add</td><td>([^<]*)</td>', added) == ["b", "p"]
    assert "api POST /admin/" not in admin.get("/console/audit").text


def test_projects_on_clusters_are_paged_and_a_link_opens_the_right_page(
    clustered: tuple[ConsoleServer, FailoverRedis],
) -> None:
    srv, _ = clustered
    names = [f"many-{i:03d}" for i in range(55)]

    def assign(name: str) -> None:
        srv.admin("POST", "/admin/projects", name=name)
        srv.admin("PUT", f"/admin/projects/{name}/clusters", primary="p", backup="b")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(assign, names))
    client = sign_in(srv, "admin")

    def listed(page: str) -> list[str]:
        return re.findall(r'<article class="cluster-project[^"]*" id="project-([^"]+)"', page)

    first = client.get("/console/clusters", params={"q": "many-"})
    assert listed(first.text) == names[:50]
    assert "Projects 1–50 of 55 (page 1 of 2)" in first.text
    assert 'href="?q=many-&amp;page=2" rel="next"' in first.text  # the next page keeps the find
    second = client.get("/console/clusters", params={"q": "many-", "page": "2"})
    assert listed(second.text) == names[50:]
    # Sorted by name, many-000..049 fill page 1 whatever else is on clusters (pay, shop).
    linked = client.get("/console/clusters", params={"project": "many-053"})
    assert "(page 2 of" in linked.text and listed(linked.text)[:5] == names[50:]
    assert 'class="cluster-project target" id="project-many-053"' in linked.text

    # Those failed over, as the API says before and after the page (a loaded machine's probes
    # may fail p meanwhile; a project never fails back by itself, so the set only grows).
    def on_backup() -> set[str]:
        return {n for n in names if failover_of(srv, n)["active"] == "b"}

    before = on_backup()
    moved = client.get("/console/clusters", params={"moved": "1", "q": "many-"})
    shown = set(listed(moved.text))
    assert before <= shown <= on_backup()
    assert bool(shown) or 'id="no-projects"' in moved.text
    bad = client.get("/console/clusters", params={"page": "0"})
    assert bad.status_code == 400 and "page is a page number" in bad.text
