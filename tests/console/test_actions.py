"""The console's actions (issue 29): send a test message through the produce path, purge a
topic's queue or a consumer's backlog after a counted plan confirmed by typing the name, dead
letters filtered and moved or copied back to their consumer at a rate, each message one click
from its trace. HTTP against a real console server (tests/console/conftest.py)."""

from __future__ import annotations

import html
import re
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests.conftest import wait_until
from tests.console.conftest import ConsoleServer, csrf_of, sign_in

SMALL_BODY = 64  # the send server's max_message_bytes: the API's limit, set once


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleServer]:
    srv = ConsoleServer(
        tmp_path_factory.mktemp("actions") / "data", env={"MQGATE_MAX_MESSAGE_BYTES": str(SMALL_BODY)}
    )
    srv.data_dir.mkdir(parents=True)
    srv.add_user("admin", "admin")
    srv.add_user("viewer", "viewer")
    srv.start()
    yield srv
    srv.stop()


def text(page: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


def names(page: str, field: str) -> bool:
    """The error on the page names `field` (the error page's and the send form's alert)."""
    return f'class="field">({html.escape(field)})</span>' in page


def produce(srv: ConsoleServer, token: str, producer: str, **fields: Any) -> dict[str, Any]:
    r = httpx.post(srv.url + "/mq/produce", json={"producer": producer, **fields},
                   headers={"Authorization": f"Bearer {token}"}, timeout=30)  # fmt: skip
    assert r.status_code == 200, r.text
    receipt: dict[str, Any] = r.json()["result"]
    return receipt


def lag(srv: ConsoleServer, consumer: str) -> dict[tuple[str, int], int]:
    progress = srv.admin("GET", f"/admin/consumers/{consumer}/progress")
    return {(q["source"], q["queue"]): q["lag"] for q in progress["queues"]}


# --- send --------------------------------------------------------------------------------


def test_a_sent_message_goes_through_the_produce_path_is_audited_and_links_its_trace(
    small: ConsoleServer,
) -> None:
    small.admin("POST", "/admin/topics", name="snd", queues=2, maxPriority=3)
    small.admin("POST", "/admin/producers", name="snd-p", topic="snd")
    small.admin("POST", "/admin/consumers", name="snd-c", topic="snd", start="earliest")
    admin = sign_in(small, "admin")
    form = admin.get("/console/topics/snd/send").text
    assert ">snd-p</option>" in form
    r = admin.post("/console/topics/snd/send", data={
        "csrf": csrf_of(admin, "/console/topics/snd/send"), "producer": "snd-p",
        "message": '  {"total": 20}  ', "keys": "order-1\norder-2", "properties": "source=console\nnote=a=b",
        "orderKey": "o-1", "priority": "2", "ttlMs": "60000",
    })  # fmt: skip
    assert r.status_code == 303, r.text
    sent = parse_qs(urlsplit(r.headers["location"]).query)
    msg_id, queue, offset = sent["sent"][0], int(sent["queue"][0]), int(sent["offset"][0])
    page = admin.get(r.headers["location"]).text
    assert f"/console/traces?by=msgId&amp;value={msg_id}" in page
    found = small.admin("GET", f"/mq/browse?topic=snd&queue={queue}&offset={offset}&max=1")["msgList"][0]
    assert found["messageId"] == msg_id and found["message"] == '  {"total": 20}  '  # as typed
    assert found["producer"] == "snd-p" and found["keys"] == ["order-1", "order-2"]
    assert found["properties"]["note"] == "a=b" and found["priority"] == 2 and found["deadline"]
    assert sum(lag(small, "snd-c").values()) == 1  # a consumer of the topic gets it
    audit = text(admin.get("/console/audit", params={"action": "topic.send"}).text)
    assert "topic.send" in audit and "snd" in audit and msg_id in audit


@pytest.fixture(scope="module")
def sndbad(small: ConsoleServer) -> None:
    small.admin("POST", "/admin/topics", name="sndbad", queues=1, maxPriority=3)
    small.admin("POST", "/admin/producers", name="sndbad-p", topic="sndbad")


@pytest.mark.parametrize(
    ("fields", "status", "field"),
    [
        ({"message": "x" * (SMALL_BODY + 1)}, 413, "message"),  # the API's max_message_bytes
        ({"message": "ok", "priority": "x"}, 400, "priority"),
        ({"message": "ok", "priority": "9"}, 400, "priority"),  # over the topic's maxPriority
        ({"message": "ok", "properties": "no equals sign"}, 400, "properties"),
        ({"message": "ok", "delayMs": "5", "deliverAt": "1900000000000"}, 400, "delayMs"),
        ({"message": "ok", "deliverAt": "tomorrow"}, 400, "deliverAt"),
        ({"message": "ok", "ttlMs": "0"}, 400, "ttlMs"),
        ({"message": "ok", "keys": "k" * 257}, 400, "keys"),
        ({"message": ""}, 400, "message"),
        ({"message": "ok", "producer": "someone-else"}, 400, "producer"),
    ],
)
def test_bad_send_input_is_refused_naming_the_field_and_keeps_the_form(
    small: ConsoleServer, sndbad: None, fields: dict[str, str], status: int, field: str
) -> None:
    admin = sign_in(small, "admin")
    data = {"csrf": csrf_of(admin, "/console/topics/sndbad/send"), "producer": "sndbad-p", **fields}
    r = admin.post("/console/topics/sndbad/send", data=data)
    assert r.status_code == status, r.text
    assert names(r.text, field)
    assert 'id="send"' in r.text  # the form again, with what was typed
    if fields["message"]:
        assert html.escape(fields["message"][:20]) in r.text
    browse = small.admin("GET", "/mq/browse?topic=sndbad&queue=0&offset=0")
    assert browse["msgList"] == []  # nothing was produced


def test_a_viewer_may_not_send_or_purge(small: ConsoleServer) -> None:
    small.admin("POST", "/admin/topics", name="sndview", queues=1)
    viewer = sign_in(small, "viewer")
    assert viewer.get("/console/topics/sndview/send").status_code == 403
    assert viewer.get("/console/topics/sndview/purge").status_code == 403
    token = csrf_of(viewer)
    r = viewer.post("/console/topics/sndview/purge", data={"csrf": token, "confirm": "sndview"})
    assert r.status_code == 403


def test_an_owner_cannot_reach_another_project_through_the_actions(small: ConsoleServer) -> None:
    """An owner of one project sees another project's topics and consumers as missing (404, as
    a name that does not exist: no 403 naming the project), and cannot send through a producer
    whose own topic is in that project, even one listing their topic among its destinations
    (a produce goes to the producer's own topic: the message landed in the hidden project)."""
    for p in ("mine", "secret"):
        small.admin("POST", "/admin/projects", name=p)
    small.admin("POST", "/admin/topics", name="m-topic", queues=1, project="mine")
    small.admin("POST", "/admin/topics", name="s-topic", queues=1, project="secret")
    small.admin("POST", "/admin/producers", name="s-prod", topic="s-topic", destinations=["m-topic"])
    small.admin("POST", "/admin/consumers", name="s-cons", topic="s-topic", start="earliest")
    small.add_user("bob", "owner", "mine")
    bob = sign_in(small, "bob")
    for hidden, missing_too in (
        ("/console/topics/s-topic/send", "/console/topics/no-topic/send"),
        ("/console/topics/s-topic/purge", "/console/topics/no-topic/purge"),
        ("/console/consumers/s-cons/purge", "/console/consumers/no-cons/purge"),
        ("/console/consumers/s-cons/dead-letters", "/console/consumers/no-cons/dead-letters"),
    ):
        seen, unknown = bob.get(hidden), bob.get(missing_too)
        assert seen.status_code == unknown.status_code == 404, hidden
        assert "secret" not in seen.text
    r = bob.post("/console/consumers/s-cons/dead-letters/preview",
                 data={"csrf": csrf_of(bob), "scope": "filter"})  # fmt: skip
    assert r.status_code == 404 and "secret" not in r.text
    form = bob.get("/console/topics/m-topic/send").text
    assert "s-prod" not in form  # not a producer of m-topic: its messages go to s-topic
    sent = {"csrf": csrf_of(bob, "/console/topics/m-topic/send"), "producer": "s-prod", "message": "x"}
    r = bob.post("/console/topics/m-topic/send", data=sent)
    assert r.status_code == 400 and names(r.text, "producer")
    assert set(lag(small, "s-cons").values()) == {0}  # nothing reached s-topic (s-cons reads from its start)


# --- purge -------------------------------------------------------------------------------


def setup_purge(srv: ConsoleServer, topic: str) -> str:
    srv.admin("POST", "/admin/topics", name=topic, queues=2)
    ptoken: str = srv.admin("POST", "/admin/producers", name=f"{topic}-p", topic=topic)["token"]
    for c in ("a", "b"):
        srv.admin("POST", "/admin/consumers", name=f"{topic}-{c}", topic=topic, start="earliest")
    for i in range(3):
        produce(srv, ptoken, f"{topic}-p", message=f"q0 {i}", orderKey="zero")
    receipt = produce(srv, ptoken, f"{topic}-p", message="other", orderKey="one")
    assert receipt["queue"] != produce(srv, ptoken, f"{topic}-p", message="q0 3", orderKey="zero")["queue"]
    return str(receipt["queue"])


def test_a_topic_queue_purge_shows_its_plan_refuses_a_wrong_name_and_skips_every_consumer(
    small: ConsoleServer,
) -> None:
    other = int(setup_purge(small, "pt"))
    q0 = 1 - other
    admin = sign_in(small, "admin")
    page = admin.get("/console/topics/pt/purge", params={"queue": q0}).text
    assert re.search(r'id="purge-skipped">8<', page)  # 4 messages x 2 consumers
    per_consumer = re.search(r'id="purge-per-consumer".*?</table>', page, re.S)
    assert per_consumer is not None and text(per_consumer.group(0)).count(" 4 ") == 2
    assert "stay in the log until retention" in text(page)
    token = csrf_of(admin, "/console/topics/pt/purge")
    r = admin.post("/console/topics/pt/purge", data={"csrf": token, "queue": q0, "confirm": "p"})
    assert r.status_code == 400 and names(r.text, "confirm")
    assert lag(small, "pt-a")[("pt", q0)] == 4  # nothing moved
    r = admin.post("/console/topics/pt/purge", data={"csrf": token, "queue": q0, "confirm": "pt"})
    assert (
        r.status_code == 303
        and "8 messages skipped" in parse_qs(urlsplit(r.headers["location"]).query)["note"][0]
    )
    for c in ("pt-a", "pt-b"):
        lags = lag(small, c)
        assert lags[("pt", q0)] == 0 and lags[("pt", other)] == 1  # the other queue untouched
    browse = small.admin("GET", f"/mq/browse?topic=pt&queue={q0}&offset=0")
    assert len(browse["msgList"]) == 4  # still in the log
    audit = text(admin.get("/console/audit", params={"action": "topic.purge"}).text)
    assert "topic.purge" in audit and "pt" in audit


def test_a_consumer_purge_skips_its_backlog_alone(small: ConsoleServer) -> None:
    setup_purge(small, "pc")
    admin = sign_in(small, "admin")
    page = admin.get("/console/consumers/pc-a/purge").text
    assert re.search(r'id="purge-skipped">5<', page)
    token = csrf_of(admin, "/console/consumers/pc-a/purge")
    r = admin.post("/console/consumers/pc-a/purge", data={"csrf": token, "confirm": "pc-b"})
    assert r.status_code == 400 and names(r.text, "confirm")
    r = admin.post("/console/consumers/pc-a/purge", data={"csrf": token, "confirm": "pc-a"})
    assert r.status_code == 303
    assert sum(lag(small, "pc-a").values()) == 0 and sum(lag(small, "pc-b").values()) == 5


def test_purge_queue_out_of_range_is_refused_naming_queue(small: ConsoleServer) -> None:
    small.admin("POST", "/admin/topics", name="pq", queues=2)
    admin = sign_in(small, "admin")
    r = admin.get("/console/topics/pq/purge", params={"queue": 2})
    assert r.status_code == 400 and names(r.text, "queue")


# --- dead letters ------------------------------------------------------------------------


def dead_lettered(srv: ConsoleServer, topic: str) -> None:
    """Messages that expire before their pull: 2 read from queue 0, 1 from queue 1."""
    srv.admin("POST", "/admin/topics", name=topic, queues=2)
    ptoken = srv.admin("POST", "/admin/producers", name=f"{topic}-p", topic=topic)["token"]
    ctoken = srv.admin("POST", "/admin/consumers", name=f"{topic}-c", topic=topic, start="earliest")["token"]
    srv.admin("POST", "/admin/consumers", name=f"{topic}-other", topic=topic, start="latest")
    queues = [produce(srv, ptoken, f"{topic}-p", message=f"late {i}", ttlMs=1, orderKey=k)["queue"]
              for i, k in enumerate(["x", "x", "w"])]  # fmt: skip
    assert queues[0] == queues[1] != queues[2]
    time.sleep(0.01)  # the 1 ms validity passes: a deadline in time, not a wait for a process

    def dead() -> bool:
        httpx.get(srv.url + "/mq/message", params={"topic": topic, "consumer": f"{topic}-c"},
                  headers={"Authorization": f"Bearer {ctoken}"}, timeout=10)  # fmt: skip
        return bool(srv.admin("GET", f"/admin/consumers/{topic}-c/dead-letters")["max"] >= 3)

    wait_until(dead, 15, "3 dead letters")


def offsets_shown(page: str) -> list[int]:
    return [int(o) for o in re.findall(r'<tr data-offset="(\d+)">', page)]


def test_dead_letters_filter_preview_and_move_or_copy_back_to_their_consumer(small: ConsoleServer) -> None:
    dead_lettered(small, "dl")
    admin = sign_in(small, "admin")
    url = "/console/consumers/dl-c/dead-letters"
    assert offsets_shown(admin.get(url).text) == [0, 1, 2]
    assert offsets_shown(admin.get(url, params={"reason": "max_attempts"}).text) == []
    page = admin.get(url, params={"reason": "expired", "source": "dl"}).text
    assert offsets_shown(page) == [0, 1, 2]
    q_of = {o: q for o, q in re.findall(r'data-offset="(\d+)">.*?dl queue (\d+)', page, re.S)}
    q_two = q_of["0"]
    assert offsets_shown(admin.get(url, params={"queue": q_two}).text) == [0, 1]
    assert offsets_shown(admin.get(url, params={"until": "1000"}).text) == []  # dead long after 1970
    bad = admin.get(url, params={"since": "soon"})
    assert bad.status_code == 400 and names(bad.text, "since")
    assert 'href="/console/traces?by=msgId&amp;value=' in page  # each id one click from its trace

    token = csrf_of(admin, url)
    form = {"csrf": token, "scope": "filter", "queue": q_two, "mode": "copy"}
    preview = admin.post(url + "/preview", data=form)
    assert preview.status_code == 200 and re.search(r'id="will-copy">2<', preview.text)
    assert admin.post(url + "/redrive", data=form).status_code == 400  # not confirmed
    r = admin.post(url + "/redrive", data={**form, "confirmed": "yes"})
    assert (
        r.status_code == 303 and "2 copied back" in parse_qs(urlsplit(r.headers["location"]).query)["note"][0]
    )
    assert offsets_shown(admin.get(url).text) == [0, 1, 2]  # a copy leaves them waiting
    assert lag(small, "dl-c")[("%INBOX%dl-c", 0)] == 2 and lag(small, "dl-other")[("%INBOX%dl-other", 0)] == 0

    # Paced: a task in the background moves one now, the next in 20 s (0.05 a second); cancelled,
    # the rest stay waiting.
    r = admin.post(url + "/redrive", data={"csrf": token, "scope": "filter", "mode": "move", "rate": "0.05",
                                           "confirmed": "yes"})  # fmt: skip
    assert "started in the background" in parse_qs(urlsplit(r.headers["location"]).query)["note"][0]
    wait_until(lambda: offsets_shown(admin.get(url).text) == [1, 2], 15, "the first one moved")
    busy = admin.post(url + "/redrive", data={"csrf": token, "scope": "filter", "mode": "move", "rate": "1",
                                              "confirmed": "yes"})  # fmt: skip
    assert busy.status_code == 409 and "running already" in text(busy.text)
    assert admin.post(url + "/redrive/cancel", data={"csrf": token}).status_code == 303
    wait_until(lambda: 'data-state="cancelled"' in admin.get(url).text, 15, "the task cancelled")
    assert offsets_shown(admin.get(url).text) == [1, 2]
    r = admin.post(url + "/redrive", data={"csrf": token, "scope": "selected", "offset": ["2"]})
    assert r.status_code == 303
    assert offsets_shown(admin.get(url).text) == [1]
    assert lag(small, "dl-c")[("%INBOX%dl-c", 0)] == 4 and lag(small, "dl-other")[("%INBOX%dl-other", 0)] == 0
    bad = admin.post(
        url + "/redrive", data={"csrf": token, "scope": "filter", "rate": "0", "confirmed": "yes"}
    )
    assert bad.status_code == 400 and names(bad.text, "rate")
    audit = text(admin.get("/console/audit", params={"action": "deadletter.redrive"}).text)
    assert "copy" in audit and "move" in audit


def test_a_paced_redrive_takes_its_time_in_the_background(small: ConsoleServer) -> None:
    dead_lettered(small, "dlp")
    admin = sign_in(small, "admin")
    url = "/console/consumers/dlp-c/dead-letters"
    token = csrf_of(admin, url)
    started = time.monotonic()
    r = admin.post(url + "/redrive", data={"csrf": token, "scope": "filter", "mode": "copy", "rate": "10",
                                           "confirmed": "yes"})  # fmt: skip
    assert r.status_code == 303 and "started+in+the+background" in r.headers["location"]

    def done() -> bool:
        return 'data-state="done"' in admin.get("/console/live/consumers/dlp-c/redrive").text

    wait_until(done, 15, "the background copy done")
    took = time.monotonic() - started
    assert took >= 0.2  # 3 at 10 a second: appended at 0, 0.1 and 0.2 s
    part = admin.get("/console/live/consumers/dlp-c/redrive").text
    assert re.search(r'id="redrive-copied">3<', part) and "started by admin" in part
    assert lag(small, "dlp-c")[("%INBOX%dlp-c", 0)] == 3
    audit = text(admin.get("/console/audit", params={"action": "deadletter.redrive"}).text)
    assert "deadletter.redrive.start" in audit and '"state": "done"' in audit and '"copied": 3' in audit


# --- browse ------------------------------------------------------------------------------


def test_browse_links_ids_to_traces_keeps_tokens_whole_and_offers_topics_without_one(
    small: ConsoleServer,
) -> None:
    small.admin("POST", "/admin/topics", name="brw", queues=1)
    ptoken = small.admin("POST", "/admin/producers", name="brw-p", topic="brw")["token"]
    receipt = produce(small, ptoken, "brw-p", message='{"total": 20}')
    admin = sign_in(small, "admin")
    empty = admin.get("/console/messages").text
    assert 'id="pick-topic"' in empty and 'href="/console/messages?topic=brw"' in empty
    page = admin.get("/console/messages", params={"topic": "brw"}).text
    assert f'href="/console/traces?by=msgId&amp;value={receipt["msgId"]}"' in page
    assert '<link rel="stylesheet" href="/console/static/console.css">' in page
    css = admin.get("/console/static/console.css").text  # every page's: no body breaks inside a word
    assert re.search(r"pre\.body, pre\.diff \{[^}]*word-break: normal; overflow-wrap: break-word", css)
    assert "break-all" not in css.split("pre.body")[1].split("}")[0]
