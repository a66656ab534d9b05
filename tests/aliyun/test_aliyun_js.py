"""Alibaba Cloud MQ's HTTP API on a real gateway, driven by the official Node SDK unchanged
(`@aliyunmq/mq-http-sdk`, pinned in tests/aliyun/js/package-lock.json and installed by
`make js-deps`).

tests/aliyun/js/aliyun_suite.mjs runs the scenarios under Node and prints one JSON line per
scenario; this module starts the gateway on each store, makes the instance (a project), its
access key and a topic with a mode=message group per scenario, runs the script and fails naming
every scenario that did not pass."""

from __future__ import annotations

import json
import secrets

import pytest

from tests.conftest import ROOT, Server
from tests.js_suites import node_with, run_suite
from tests.sqs import test_sqs_boto3
from tests.sqs.test_sqs_boto3 import make_key

pytestmark = pytest.mark.slow

JS_DIR = ROOT / "tests" / "aliyun" / "js"
SUITE = JS_DIR / "aliyun_suite.mjs"
SDK = JS_DIR / "node_modules" / "@aliyunmq" / "mq-http-sdk" / "package.json"
# Each scenario of aliyun_suite.mjs with its group's invisible time (lockTimeoutS).
SCENARIOS: dict[str, tuple[str, float]] = {
    "publish_consume_ack_tags_keys_properties": ("basic", 30.0),
    "long_poll_woken_by_publish": ("longpoll", 30.0),
    "delayed_message": ("delay", 30.0),
    "redelivery_and_bad_handles": ("redelivery", 1.0),
    "ordered_consume": ("ordered", 30.0),
    "transaction_commit_rollback_check": ("trans", 30.0),
    "wrong_secret": ("basic", 30.0),
    "unknown_topic": ("basic", 30.0),
}
SUITE_TIMEOUT_S = 300.0  # ~10 s when all is well; each scenario bounds itself at 60 s

srv = test_sqs_boto3.srv  # the same gateways, one per store


@pytest.fixture(scope="module")
def sdk() -> str:
    """Node 20 or later with the SDK installed: failing in CI without them, skipped loudly elsewhere."""
    return node_with(SDK, JS_DIR)


def test_node_sdk(sdk: str, srv: Server) -> None:
    suffix = secrets.token_hex(4)
    project = f"MQ_INST_js{suffix}"
    key = make_key(srv, f"ali-js-{suffix}", project)
    topics: dict[str, dict[str, str]] = {}
    for name, lock_timeout_s in dict(SCENARIOS.values()).items():
        topic, group = f"{name}-{suffix}", f"GID_{name}_{suffix}"
        srv.admin("POST", "/admin/topics", name=topic, queues=4, project=project)
        srv.admin(
            "POST", "/admin/consumers", name=group, topic=topic, mode="message", lockTimeoutS=lock_timeout_s
        )
        topics[name] = {"topic": topic, "group": group}
    config = {
        "endpoint": srv.url,
        "instance": project,
        "keyId": key["accessKeyId"],
        "secret": key["secretAccessKey"],
        "topics": topics,
    }
    sdk_version = json.loads(SDK.read_text())["version"]
    command = [sdk, str(SUITE), json.dumps(config)]
    run_suite(command, JS_DIR, f"@aliyunmq/mq-http-sdk {sdk_version}", SCENARIOS, srv, SUITE_TIMEOUT_S)
