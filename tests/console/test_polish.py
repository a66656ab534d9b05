"""The console's finish (issue 29 item 5), over HTTP against a real gateway with the console:
the settings page for admins, the favicon, the pending-applications badge, forms that start
from the API's own defaults, destructive actions marked and confirmed."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import msgspec
import pytest

from mqgate.api.shapes import ConsumerIn
from tests.console.conftest import ADMIN_TOKEN, ConsoleServer, csrf_of, sign_in


@pytest.fixture(scope="module")
def polished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleServer]:
    srv = ConsoleServer(tmp_path_factory.mktemp("polish") / "data", env={"MQGATE_DEFAULT_QUEUES": "3"})
    srv.data_dir.mkdir(parents=True)
    srv.add_user("admin", "admin")
    srv.add_user("olga", "owner", "default")
    srv.add_user("oscar", "owner", "elsewhere")
    srv.add_user("mia", "member", "default")
    srv.start()
    yield srv
    srv.stop()


def test_settings_page_shows_values_with_sources_to_admins_only(polished: ConsoleServer) -> None:
    admin = sign_in(polished, "admin")
    changed = admin.get("/console/settings")
    assert changed.status_code == 200
    row = re.search(r'<tr data-setting="default_queues">(.*?)</tr>', changed.text, re.S)
    assert (
        row is not None and "<code>3</code>" in row.group(1) and "env MQGATE_DEFAULT_QUEUES" in row.group(1)
    )
    assert 'data-setting="admin_token"' in changed.text  # set through the environment...
    assert ADMIN_TOKEN not in changed.text and "(set, hidden)" in changed.text  # ...and never shown
    assert 'data-setting="alert_webhook_url"' not in changed.text  # at its default: only under "all"
    everything = admin.get("/console/settings?show=all").text
    assert len(re.findall(r"<tr data-setting=", everything)) > 60
    assert 'data-setting="alert_webhook_url"' in everything
    assert sign_in(polished, "olga").get("/console/settings").status_code == 403
    nav = admin.get("/console/").text
    assert 'href="/console/settings"' in nav and 'href="/console/clusters"' in nav
    assert 'href="/console/settings"' not in sign_in(polished, "olga").get("/console/").text


def test_every_page_has_a_favicon(polished: ConsoleServer) -> None:
    page = httpx.get(polished.url + "/console/signin").text
    href = re.search(r'<link rel="icon" href="([^"]+)"', page)
    assert href is not None
    icon = httpx.get(polished.url + href.group(1))
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
    assert icon.content.startswith(b"<svg")


def badge(client: httpx.Client) -> str | None:
    found = re.search(r'<span class="badge" id="pending-badge">(\d+)<', client.get("/console/topics").text)
    return found.group(1) if found else None


def test_approvers_see_what_waits_for_them(polished: ConsoleServer) -> None:
    mia, olga, oscar = (sign_in(polished, n) for n in ("mia", "olga", "oscar"))
    assert badge(olga) is None
    for name in ("app-one", "app-two"):
        r = mia.post("/console/applications", data={"csrf": csrf_of(mia), "kind": "topic", "name": name,
                                                     "project": "default"})  # fmt: skip
        assert r.status_code == 303, r.text
    assert badge(olga) == "2"  # owner of the project
    assert badge(sign_in(polished, "admin")) == "2"  # admin: every project
    assert badge(oscar) is None  # owner of another project: nothing of theirs waits
    assert badge(mia) is None  # a member applies, does not decide
    page = olga.get("/console/applications").text
    first = re.search(r'action="(/console/applications/\d+/approve)"', page)
    assert first is not None
    assert olga.post(first.group(1), data={"csrf": csrf_of(olga), "comment": ""}).status_code == 303
    assert badge(olga) == "1"


def test_consumer_forms_start_from_the_api_defaults(polished: ConsoleServer) -> None:
    defaults = {f.name: f.default for f in msgspec.structs.fields(ConsumerIn)}
    admin = sign_in(polished, "admin")
    polished.admin("POST", "/admin/topics", name="dflt", queues=1)
    page = admin.get("/console/clients").text
    start = re.search(r'<select id="c-start" name="start">(.*?)</select>', page, re.S)
    assert start is not None and f"<option selected>{defaults['start']}</option>" in start.group(1)
    topics = admin.get("/console/topics").text
    assert re.search(r'id="t-queues" name="queues" type="number" min="1" value="3"', topics)  # the setting
    applying = sign_in(polished, "mia").get("/console/applications").text
    assert re.search(r'id="at-queues" name="queues" type="number" min="1" value="3"', applying)

    producer = polished.admin("POST", "/admin/producers", name="dflt-p", topic="dflt")["token"]
    for i in range(3):
        r = httpx.post(polished.url + "/mq/produce", json={"producer": "dflt-p", "message": f"m{i}"},
                       headers={"Authorization": f"Bearer {producer}"})  # fmt: skip
        assert r.status_code == 200, r.text
    # A consumer registered from the console with the start left blank starts where the API's does.
    blank = {"csrf": csrf_of(admin), "name": "dflt-c", "topic": "dflt"}
    r = admin.post("/console/clients/consumer", data=blank)
    assert r.status_code == 200, r.text
    assert polished.admin("GET", "/admin/consumers/dflt-c/progress")["lag"] == 3  # earliest
    r = admin.post("/console/clients/consumer", data={**blank, "name": "dflt-x", "start": "soon"})
    assert r.status_code == 400 and "start" in r.text  # the API's check, the API's field


def test_irreversible_and_destructive_actions_are_marked_and_confirmed(polished: ConsoleServer) -> None:
    admin = sign_in(polished, "admin")
    polished.admin("POST", "/admin/topics", name="marks", queues=1)
    polished.admin("POST", "/admin/producers", name="marks-p", topic="marks")
    topics = admin.get("/console/topics?q=marks").text
    grow = re.search(r'<form method="post" action="/console/topics/marks/grow"[^>]*>', topics)
    assert grow is not None and "data-confirm=" in grow.group(0) and "cannot be taken away" in grow.group(0)
    clients = admin.get("/console/clients?q=marks").text
    rotate = re.search(
        r'<button type="submit" class="(\w+)" aria-label="Rotate the token of producer marks-p"', clients
    )
    revoke = re.search(
        r'<button type="submit" class="(\w+)" aria-label="Revoke the token of producer marks-p', clients
    )
    assert rotate is not None and revoke is not None
    assert rotate.group(1) != revoke.group(1)  # they no longer look the same
    assert revoke.group(1) in ("caution", "danger")


def test_settings_page_shows_a_human_form_beside_raw_numbers(polished: ConsoleServer) -> None:
    page = sign_in(polished, "admin").get("/console/settings?show=all").text
    for name, raw, said in (
        ("segment_bytes", "67108864", "64.00 MiB"),
        ("default_retention_ms", "604800000", "7 days"),
    ):
        row = re.search(rf'<tr data-setting="{name}">(.*?)</tr>', page, re.S)
        assert row is not None and f'<code>{raw}</code> <span class="human">({said})</span>' in row.group(1)
    meanings = re.findall(r'<td data-label="Meaning" class="muted">([^<]*)</td>', page)
    assert len(meanings) > 60 and all(m.strip() for m in meanings)
