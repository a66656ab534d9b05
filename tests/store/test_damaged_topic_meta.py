"""A damaged `topics/<name>/topic.json` costs that topic only: the gateway starts and serves the
others, the damaged one answers a JSON error naming it (never a traceback), the fault is counted
in /metrics and shown in /healthz, and `mqgate check` reports it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.conftest import MQGATE, Server

# Starts gateways or servers test by test: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow


def produce(srv: Server, token: str, producer: str, message: str) -> httpx.Response:
    return httpx.post(
        srv.url + "/mq/produce",
        json={"producer": producer, "message": message},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


@pytest.mark.parametrize("damage", [b'{"name": "bad", "queu', b"\x00" * 40, b'{"name": "bad"}', b"[]"])
def test_a_damaged_topic_json_costs_that_topic_only(tmp_path: Path, damage: bytes) -> None:
    data_dir = tmp_path / "data"
    srv = Server(data_dir).start()
    try:
        good_p, good_c = srv.setup_topic("good", queues=2)
        bad_p, bad_c = srv.setup_topic("bad", queues=2)
        for topic, token in (("good", good_p), ("bad", bad_p)):
            assert produce(srv, token, f"{topic}-p", f"before {topic}").status_code == 200
        srv.stop()
        (data_dir / "topics" / "bad" / "topic.json").write_bytes(damage)

        srv.start()
        assert produce(srv, good_p, "good-p", "after").status_code == 200
        pulled = httpx.get(
            srv.url + "/mq/message",
            params={"topic": "good", "consumer": "good-c", "max": 10},
            headers={"Authorization": f"Bearer {good_c}"},
            timeout=30,
        ).json()["result"]
        assert sorted(m["message"] for m in pulled["msgList"]) == ["after", "before good"]

        answers = [
            produce(srv, bad_p, "bad-p", "refused"),
            httpx.get(
                srv.url + "/mq/message",
                params={"topic": "bad", "consumer": "bad-c", "max": 10},
                headers={"Authorization": f"Bearer {bad_c}"},
                timeout=30,
            ),
            httpx.get(
                srv.url + "/mq/read",
                params={"topic": "bad", "queue": 0, "offset": 0},
                headers={"Authorization": f"Bearer {srv.admin_token}"},
                timeout=30,
            ),
            # grown in the registry only, answered 200, while its store topic stayed as it was
            httpx.patch(
                srv.url + "/admin/topics/bad",
                json={"queues": 4},
                headers={"Authorization": f"Bearer {srv.admin_token}"},
                timeout=30,
            ),
        ]
        for r in answers:
            assert r.status_code == 503, r.text
            body = r.json()
            assert body["result"]["code"] == "topic_damaged" and body["result"]["field"] == "topic", body
            assert "bad" in body["message"] and "topic.json" in body["message"], body

        assert srv.admin("GET", "/admin/topics/bad")["queues"] == 2
        health = httpx.get(srv.url + "/healthz", timeout=10).json()["result"]
        assert health["status"] == "degraded" and "topic bad" in health["degraded"], health
        assert any(f["kind"] == "topic_unreadable" for f in health["faults"]), health
        metrics = httpx.get(srv.url + "/metrics", timeout=10).text
        assert 'mqgate_storage_faults_total{component="message_log",kind="topic_unreadable"} 1.0' in metrics
        assert "Traceback" not in srv.log_tail()
    finally:
        srv.stop()

    done = subprocess.run(
        [MQGATE, "check", "--json", "--data-dir", str(data_dir)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stdout + done.stderr
    reports = {r["path"]: r for r in json.loads(done.stdout)}
    assert "unreadable" in reports["topics/bad/topic.json"]["problems"][0]
