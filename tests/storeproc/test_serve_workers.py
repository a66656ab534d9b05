"""`mqgate serve --workers N` on the embedded store: N gateway processes on one port beside a
store process that owns the data directory's files (real processes, real kills)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import Client, Server, wait_until

# Starts gateways process by process: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow


def children(parent: int) -> dict[int, bytes]:
    """The live processes whose parent is `parent`, with their command lines."""
    found: dict[int, bytes] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == parent and state != "Z":
            found[int(entry.name)] = cmdline
    return found


def store_process_pid(serve_pid: int) -> int | None:
    """The store process the serve command started (its child running mqgate.cli.store_process)."""
    pids = [pid for pid, cmdline in children(serve_pid).items() if b"mqgate.cli.store_process" in cmdline]
    return pids[0] if pids else None


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


def drain(client: Client, topic: str, expected: set[str]) -> list[str]:
    """Pull and ack until every expected message was seen (more may come: a produce answered
    503 may have been stored) and a pull finds nothing more, or 60 s."""
    seen: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        result = client.pull(topic, f"{topic}-c", max=100, wait=1).json()["result"]
        if result["status"] != "FOUND":
            if expected <= set(seen):
                break
            continue
        seen += [m["message"] for m in result["msgList"]]
        assert client.call("/mq/ack", consumer=f"{topic}-c", requestId=result["requestId"]).status_code == 200
    return seen


def test_workers_share_the_store_process_messages_offsets_and_registry(tmp_path: Path) -> None:
    srv = Server(tmp_path / "data", extra_args=["--workers", "2"]).start()
    try:
        assert srv.proc is not None
        pids = set()
        deadline = time.monotonic() + 20
        while len(pids) < 2 and time.monotonic() < deadline:
            with httpx.Client(base_url=srv.url) as fresh:  # a new connection: any worker
                pids.add(fresh.get("/healthz").json()["result"]["pid"])
        assert len(pids) == 2, pids
        store_pid = store_process_pid(srv.proc.pid)
        assert store_pid is not None and store_pid not in pids
        ptoken, ctoken = srv.setup_topic("w", queues=4)
        # Fresh connections land on either worker; each one's produce is in the one store.
        for i in range(40):
            with httpx.Client(base_url=srv.url) as fresh:
                r = fresh.post(
                    "/mq/produce",
                    json={"producer": "w-p", "message": f"m{i}"},
                    headers={"Authorization": f"Bearer {ptoken}"},
                )
                assert r.status_code == 200, r.text
        client = Client(srv, ptoken, ctoken)
        try:
            sent = {f"m{i}" for i in range(40)}
            assert sorted(drain(client, "w", sent)) == sorted(sent)
        finally:
            client.close()
        progress = srv.admin("GET", "/admin/consumers/w-c/progress")
        assert progress["lag"] == 0 and sum(q["committed"] for q in progress["queues"]) == 40
    finally:
        srv.stop()
    assert store_pid is not None
    wait_until(lambda: not alive(store_pid), 10, "the store process to stop with the serve command")


def test_kill9_of_the_store_process_under_load_loses_nothing_acknowledged(tmp_path: Path) -> None:
    srv = Server(tmp_path / "data", extra_args=["--workers", "2"]).start()
    try:
        assert srv.proc is not None
        ptoken, ctoken = srv.setup_topic("k", queues=4)
        acknowledged: list[str] = []
        refused: list[int] = []
        stop = threading.Event()

        def produce(n: int) -> None:
            with httpx.Client(base_url=srv.url, timeout=30) as http:
                i = 0
                while not stop.is_set():
                    message = f"p{n}-{i}"
                    i += 1
                    try:
                        r = http.post(
                            "/mq/produce",
                            json={"producer": "k-p", "message": message},
                            headers={"Authorization": f"Bearer {ptoken}"},
                        )
                    except httpx.HTTPError:
                        continue
                    if r.status_code == 200:
                        acknowledged.append(message)
                    else:
                        refused.append(r.status_code)

        threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        wait_until(lambda: len(acknowledged) >= 200, 30, "200 produces before the kill")
        serve_pid = srv.proc.pid
        store_pid = store_process_pid(serve_pid)
        assert store_pid is not None
        os.kill(store_pid, signal.SIGKILL)
        # The serve command starts another; the workers reconnect to it.
        wait_until(
            lambda: (pid := store_process_pid(serve_pid)) is not None and pid != store_pid,
            20,
            "a new store process",
        )
        at_restart = len(acknowledged)
        wait_until(lambda: len(acknowledged) >= at_restart + 200, 30, "200 produces after the restart")
        stop.set()
        for t in threads:
            t.join(30)
        assert set(refused) <= {503}, refused  # in flight at the kill: 503, to retry
        client = Client(srv, ptoken, ctoken)
        try:
            seen = drain(client, "k", set(acknowledged))
        finally:
            client.close()
        assert set(acknowledged) <= set(seen), sorted(set(acknowledged) - set(seen))[:10]
        assert len(seen) == len(set(seen))  # each once: every batch was acked
        assert "the store process exited" in srv.log_tail() or "restart 1" in (
            (tmp_path / f"server-{srv.port}.log").read_text()
        )
        health = httpx.get(srv.url + "/healthz").json()["result"]
        assert health["healthy"], health
    finally:
        srv.stop()


def test_a_killed_serve_command_leaves_no_store_process_holding_the_data(tmp_path: Path) -> None:
    srv = Server(tmp_path / "data", extra_args=["--workers", "2"]).start()
    assert srv.proc is not None
    spawned = children(srv.proc.pid)
    store_pid = store_process_pid(srv.proc.pid)
    assert store_pid is not None
    again: Server | None = None
    try:
        ptoken, ctoken = srv.setup_topic("o", queues=2)
        client = Client(srv, ptoken, ctoken)
        assert client.produce("o-p", "kept").status_code == 200
        client.close()
        srv.kill9()
        # Started again at once, as a supervisor would: the orphaned store process lets go of
        # the directory (told by the kernel that its parent died) and the new one waits for it.
        again = Server(srv.data_dir, admin_token=srv.admin_token, extra_args=["--workers", "2"]).start()
        wait_until(lambda: not alive(store_pid), 15, "the orphaned store process to stop")
        client = Client(again, ptoken, ctoken)
        try:
            assert drain(client, "o", {"kept"}) == ["kept"]
        finally:
            client.close()
    finally:
        srv.stop()
        if again is not None:
            again.stop()
        for pid in spawned:  # uvicorn's workers outlive a killed parent: not this test's subject
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
