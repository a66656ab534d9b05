"""A browser reads a stream (issue 31): real Chromium opens `EventSource` and `WebSocket` on a
real gateway with a stream ticket (neither can send an Authorization header), acks each batch
(with the ticket as the bearer of a fetch, and over the socket), and gets every message once;
each resumes after its last batch (EventSource by itself when its stream ends, a new WebSocket
with `lastEventId`) with nothing lost or repeated."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import Client, Server, wait_until
from tests.stream.test_stream_sse import setup

pytestmark = pytest.mark.slow

# Reads until `n` messages came, acking each batch with a fetch that carries the ticket.
EVENT_SOURCE_JS = """
async ([query, ticket, consumer, n]) => {
  const got = [];
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('timed out with ' + got.length)), 30000);
    const es = new EventSource('/mq/stream?' + query);
    es.addEventListener('messages', async (e) => {
      const batch = JSON.parse(e.data).result;
      for (const m of batch.msgList) got.push(m.message);
      const r = await fetch('/mq/ack', {
        method: 'POST',
        headers: {'Authorization': 'Bearer ' + ticket, 'Content-Type': 'application/json'},
        body: JSON.stringify({consumer: consumer, requestId: batch.requestId}),
      });
      if (!r.ok) { es.close(); clearTimeout(timer); reject(new Error('ack ' + r.status)); }
      if (got.length >= n) { es.close(); clearTimeout(timer); resolve(); }
    });
    es.onerror = () => { if (es.readyState === EventSource.CLOSED) reject(new Error('closed')); };
  });
  return got;
}
"""

# Reads until `n` messages came, acking each batch over the socket and waiting for the answer.
WEBSOCKET_JS = """
async ([query, n]) => {
  const got = [];
  const acked = [];
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('timed out with ' + got.length)), 30000);
    const ws = new WebSocket('ws://' + location.host + '/mq/stream?' + query);
    ws.onmessage = (e) => {
      const ev = JSON.parse(e.data);
      if (ev.event === 'messages') {
        for (const m of ev.data.result.msgList) got.push(m.message);
        ws.send(JSON.stringify({ack: ev.id}));
      } else if (ev.event === 'acked') {
        acked.push(ev.outcome);
        if (got.length >= n) { ws.close(); clearTimeout(timer); resolve(); }
      } else if (ev.event === 'error') {
        reject(new Error(ev.message));
      }
    };
    ws.onclose = (e) => { if (got.length < n) reject(new Error('closed ' + e.code)); };
  });
  return {got, acked};
}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("browser-stream") / "data").start()
    yield srv
    srv.stop()


@pytest.fixture
def page(browser: Any, server: Server) -> Iterator[Any]:
    context = browser.new_context(base_url=server.url)
    page = context.new_page()
    page.goto("/healthz")  # a page of the gateway's origin: the stream is same-origin
    yield page
    context.close()


def ticket_and_messages(server: Server, topic: str, n: int) -> tuple[Client, str]:
    client = setup(server, topic, lockTimeoutS=60)
    for i in range(n):
        assert client.produce(f"{topic}-p", f"m{i}").status_code == 200
    r = client.http.post(
        "/mq/stream/tickets",
        json={"topic": topic, "consumer": f"{topic}-c"},
        headers={"Authorization": f"Bearer {client.ctoken}"},
    )
    assert r.status_code == 200, r.text
    return client, r.json()["result"]["ticket"]


def test_event_source_reads_and_acks_with_a_ticket(server: Server, page: Any) -> None:
    client, ticket = ticket_and_messages(server, "br-sse", 7)
    query = f"topic=br-sse&consumer=br-sse-c&max=3&heartbeat=1&ticket={ticket}"
    got = page.evaluate(EVENT_SOURCE_JS, [query, ticket, "br-sse-c", 7])
    # max=3: the later batches came only because the browser's acks went through.
    assert got == [f"m{i}" for i in range(7)]
    assert server.admin("GET", "/admin/consumers/br-sse-c/progress")["lag"] == 0
    client.close()


def test_websocket_reads_and_acks_with_a_ticket(server: Server, page: Any) -> None:
    client, ticket = ticket_and_messages(server, "br-ws", 7)
    query = f"topic=br-ws&consumer=br-ws-c&max=3&heartbeat=1&ticket={ticket}"
    result = page.evaluate(WEBSOCKET_JS, [query, 7])
    assert result["got"] == [f"m{i}" for i in range(7)]
    assert result["acked"] and set(result["acked"]) == {"ok"}
    assert server.admin("GET", "/admin/consumers/br-ws-c/progress")["lag"] == 0
    client.close()


# A socket that reads one batch and goes without acking it, then a new one resuming after it.
WEBSOCKET_RESUME_JS = """
async ([query, n]) => {
  const url = 'ws://' + location.host + '/mq/stream?' + query;
  const read = (extra, until) => new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('timed out')), 30000);
    const seen = [];
    const ws = new WebSocket(url + extra);
    ws.onmessage = (e) => {
      const ev = JSON.parse(e.data);
      seen.push(ev);
      if (until(seen)) { ws.close(); clearTimeout(timer); resolve(seen); }
    };
  });
  const batches = (evs) => evs.filter((ev) => ev.event === 'messages');
  const first = await read('', (evs) => batches(evs).length === 1);
  const last = batches(first)[0].id;
  const second = await read('&lastEventId=' + encodeURIComponent(last), (evs) => batches(evs).length === 1);
  const texts = (evs) => batches(evs).flatMap((ev) => ev.data.result.msgList.map((m) => m.message));
  return {got: [...texts(first), ...texts(second)], resumed: second[0]};
}
"""


def test_a_new_websocket_resumes_after_the_last_batch(server: Server, page: Any) -> None:
    client, ticket = ticket_and_messages(server, "br-wr", 4)
    query = f"topic=br-wr&consumer=br-wr-c&max=2&heartbeat=1&ticket={ticket}"
    result = page.evaluate(WEBSOCKET_RESUME_JS, [query, 4])
    assert result["got"] == ["m0", "m1", "m2", "m3"]  # the first batch was not acked, nor repeated
    assert result["resumed"]["event"] == "resumed" and result["resumed"]["outcome"] == "ok"
    client.close()


# An EventSource that never acks: only its own reconnections (with Last-Event-ID) ack.
EVENT_SOURCE_RESUME_JS = """
([query]) => {
  window.got = [];
  window.opened = 0;
  const es = new EventSource('/mq/stream?' + query);
  window.es = es;
  es.onopen = () => { window.opened += 1; };
  es.addEventListener('messages', (e) => {
    for (const m of JSON.parse(e.data).result.msgList) window.got.push(m.message);
  });
}
"""


def test_event_source_resumes_by_itself_after_its_stream_ends(server: Server, page: Any) -> None:
    client, ticket = ticket_and_messages(server, "br-sr", 2)
    # `timeout=2`: the gateway ends the stream after 2 s, as a proxy bounding an answer would.
    page.evaluate(
        EVENT_SOURCE_RESUME_JS, [f"topic=br-sr&consumer=br-sr-c&max=2&heartbeat=1&timeout=2&ticket={ticket}"]
    )
    page.wait_for_function("window.got.length === 2", timeout=30_000)
    assert client.produce("br-sr-p", "m2").status_code == 200
    # Reconnected with Last-Event-ID: the first batch acked by that, the next one delivered.
    page.wait_for_function("window.got.length === 3 && window.opened >= 2", timeout=30_000)
    assert page.evaluate("window.got") == ["m0", "m1", "m2"]  # nothing lost, nothing twice
    wait_until(
        lambda: server.admin("GET", "/admin/consumers/br-sr-c/progress")["lag"] <= 1,
        20,
        "the first batch acked by the reconnection (the second, never acked, is the lag)",
    )
    page.evaluate("window.es && window.es.close()")
    client.close()
