"""schemathesis over the whole API, generated from /openapi.json and bounded in examples and
time, with the admin token: no server error and no answer outside the documented schema
(status, content type, body, headers)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import Server

pytestmark = pytest.mark.slow

CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "response_headers_conformance",
    ]
)


def test_no_server_error_and_no_answer_outside_the_schema(tmp_path: Path) -> None:
    server = Server(tmp_path / "data").start()
    try:
        # Something to find: a topic with a producer and a consumer, and a message.
        ptoken, _ = server.setup_topic("st")
        server.admin("POST", "/admin/consumers", name="st-b", topic="st", mode="broadcast")
        produced = httpx.post(
            server.url + "/mq/produce",
            json={"producer": "st-p", "message": "hello"},
            headers={"Authorization": f"Bearer {ptoken}"},
        )
        assert produced.status_code == 200
        st = Path(sys.executable).parent / "st"
        run = subprocess.run(
            [
                str(st),
                "run",
                server.url + "/openapi.json",
                "--header",
                f"Authorization: Bearer {server.admin_token}",
                "--checks",
                CHECKS,
                "--phases",
                "examples,fuzzing,stateful",
                "--max-examples",
                "25",
                "--seed",
                "20261124",
                "--workers",
                "2",
                "--no-color",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,  # its reports directory stays out of the work tree
        )
        report = run.stdout[-6000:] + run.stderr[-2000:]
        assert run.returncode == 0, report
        assert " passed" in run.stdout and "failures" not in run.stdout.lower().split("summary")[-1], report
    finally:
        server.stop()
    assert "Traceback" not in server.log_tail(), server.log_tail()
