"""Open files are bounded: a gateway under a real `ulimit -n 1024` serves and restarts with
126 topics of 8 queues (1008 queue logs); and a topic registration is never half done."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import httpx
import pytest

from mqgate.durable.append_file import AppendFile
from mqgate.durable.framing import frame, iter_payloads
from mqgate.durable.handles import FileHandles
from tests.conftest import Server

# Starts gateways or servers test by test: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

TOPICS = 126
QUEUES = 8
NOFILE = 1024


def limit_open_files() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, min(hard, NOFILE)))


def test_a_gateway_under_ulimit_1024_serves_and_restarts_with_1008_queues(tmp_path: Path) -> None:
    srv = Server(tmp_path / "data", preexec=limit_open_files).start()
    try:
        http = httpx.Client(base_url=srv.url, timeout=30)
        admin = {"Authorization": f"Bearer {srv.admin_token}"}
        tokens = {}
        for t in range(TOPICS):
            r = http.post("/admin/topics", json={"name": f"t{t}", "queues": QUEUES}, headers=admin)
            assert r.status_code == 200, r.text
            r = http.post("/admin/producers", json={"name": f"t{t}-p", "topic": f"t{t}"}, headers=admin)
            assert r.status_code == 200, r.text
            tokens[t] = r.json()["result"]["token"]
        for round_ in range(2):  # every queue written, twice: the handles go round
            for t in range(TOPICS):
                batch = [{"message": f"t{t} r{round_} m{i}"} for i in range(QUEUES)]
                r = http.post(
                    "/mq/produce/batch",
                    json={"producer": f"t{t}-p", "messages": batch},
                    headers={"Authorization": f"Bearer {tokens[t]}"},
                )
                assert r.status_code == 200, r.text
                assert {x["queue"] for x in r.json()["result"]["receipts"]} == set(range(QUEUES))
        http.close()
        srv.stop()

        srv.start()  # under the same limit
        http = httpx.Client(base_url=srv.url, timeout=30, headers=admin)
        for t in range(TOPICS):
            stored = []
            for q in range(QUEUES):
                r = http.get("/mq/read", params={"topic": f"t{t}", "queue": q, "offset": 0, "max": 10})
                assert r.status_code == 200, r.text
                stored += [m["message"] for m in r.json()["result"]["msgList"]]
            assert sorted(stored) == sorted(f"t{t} r{r_} m{i}" for r_ in range(2) for i in range(QUEUES))
        http.close()
    finally:
        srv.stop()


def test_a_topic_whose_files_cannot_be_made_is_not_registered(tmp_path: Path) -> None:
    srv = Server(tmp_path / "data").start()
    try:
        blocker = tmp_path / "data" / "topics" / "blocked"
        blocker.write_text("not a directory")  # the store cannot make the topic's directory
        r = httpx.post(
            srv.url + "/admin/topics",
            json={"name": "blocked", "queues": 2},
            headers={"Authorization": f"Bearer {srv.admin_token}"},
            timeout=30,
        )
        assert r.status_code == 503, r.text
        assert r.json()["result"]["code"] == "storage"
        names = [t["name"] for t in srv.admin("GET", "/admin/topics")["topics"]]
        assert "blocked" not in names  # nothing half-registered

        blocker.unlink()
        srv.admin("POST", "/admin/topics", name="blocked", queues=2)
        srv.stop()
        srv.start()  # and it starts again
        assert "blocked" in [t["name"] for t in srv.admin("GET", "/admin/topics")["topics"]]
    finally:
        srv.stop()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_file_handles_keep_at_most_their_capacity_open_and_reopen_on_use(tmp_path: Path) -> None:
    before = open_fds()
    handles = FileHandles(4)
    files = [AppendFile.create(tmp_path / f"{i}.log", handles) for i in range(50)]
    assert handles.open_count == 4 and open_fds() - before <= 4
    for round_ in range(3):
        for i, f in enumerate(files):
            f.append(frame(b"%d-%d" % (round_, i)))
            assert handles.open_count <= 4
    assert open_fds() - before <= 4 and handles.reopened > 100
    for f in files:
        f.close()
    assert open_fds() == before and handles.open_count == 0
    for i in range(50):
        got = [p for _, p in iter_payloads((tmp_path / f"{i}.log").read_bytes())]
        assert got == [b"%d-%d" % (r, i) for r in range(3)]
