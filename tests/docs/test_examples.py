"""Every client example in examples/ runs against a real gateway: produce, consume, ack."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import IN_CI, ROOT, Server

# Starts gateways or servers test by test: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

EXAMPLES = {
    "curl": ["bash", "examples/curl/tour.sh"],
    "python": [sys.executable, "examples/python/client.py"],
    "node": ["node", "examples/node/client.mjs"],
    "java": ["java", "examples/java/Client.java"],
}


@pytest.mark.parametrize("language", sorted(EXAMPLES))
def test_example_produces_consumes_and_acks(shared_server: Server, language: str) -> None:
    command = EXAMPLES[language]
    if shutil.which(command[0]) is None:
        message = f"{command[0]} is not installed, so the {language} example cannot run"
        if IN_CI:
            pytest.fail(message)
        pytest.skip("SKIPPED LOUDLY: " + message)
    topic = f"ex-{language}"
    ptoken, ctoken = shared_server.setup_topic(topic, queues=3)
    env = {
        **os.environ,
        "MQGATE_URL": shared_server.url,
        "MQGATE_TOPIC": topic,
        "MQGATE_PRODUCER": f"{topic}-p",
        "MQGATE_PRODUCER_TOKEN": ptoken,
        "MQGATE_CONSUMER": f"{topic}-c",
        "MQGATE_CONSUMER_TOKEN": ctoken,
        "MQGATE_COUNT": "25",
    }
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr + out.stdout
    assert out.stdout.strip().splitlines()[-1] == "OK produced=25 consumed=25"
    progress = shared_server.admin("GET", f"/admin/consumers/{topic}-c/progress")
    assert progress["lag"] == 0 and not any(q["locked"] for q in progress["queues"])
