"""The traces page tells a user nothing about messages of projects they have no role in: an id
(or key) traced only there gets the very page an id traced nowhere gets."""

from __future__ import annotations

import uuid

import httpx

from tests.conftest import wait_until
from tests.console.conftest import ConsoleServer, sign_in


def page_for(client: httpx.Client, by: str, value: str) -> str:
    """The traces page's body for a search, the searched value blanked out (it is echoed)."""
    r = client.get("/console/traces", params={"by": by, "value": value})
    assert r.status_code == 200, r.text
    return r.text.replace(value, "VALUE")


def test_a_path_in_a_project_one_cannot_see_is_not_even_counted(console: ConsoleServer) -> None:
    console.admin("POST", "/admin/projects", name="hidden", description="not the viewer's")
    console.admin("POST", "/admin/projects", name="shown", description="the viewer's")
    console.admin("POST", "/admin/topics", name="hidden-orders", queues=1, project="hidden")
    ptoken = console.admin("POST", "/admin/producers", name="hidden-p", topic="hidden-orders")["token"]
    console.admin("POST", "/admin/trace-policies", mode="project", project="hidden", level="info")
    console.add_user("vicky", "viewer", "shown")
    key = "k-" + uuid.uuid4().hex[:8]
    r = httpx.post(
        console.url + "/mq/produce",
        json={"producer": "hidden-p", "message": "secret", "keys": [key]},
        headers={"Authorization": f"Bearer {ptoken}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    msg_id = r.json()["result"]["msgId"]
    admin = sign_in(console, "admin")

    def indexed() -> bool:  # the admin finds it, and the index has caught up
        page = admin.get("/console/traces", params={"by": "msgId", "value": msg_id}).text
        return f'data-msg-id="{msg_id}"' in page and 'id="incomplete"' not in page

    wait_until(indexed, 20, "the message to be traced")
    viewer = sign_in(console, "vicky")
    nowhere = msg_id[:-6] + "ffffff" if not msg_id.endswith("ffffff") else msg_id[:-6] + "000000"
    assert page_for(viewer, "msgId", msg_id) == page_for(viewer, "msgId", nowhere)
    assert page_for(viewer, "key", key) == page_for(viewer, "key", "k-" + uuid.uuid4().hex[:8])
    assert 'id="no-trace"' in page_for(viewer, "msgId", msg_id)
