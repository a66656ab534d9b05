"""The SQS API on a real gateway, driven by the AWS SDK for JavaScript v3 unchanged
(`@aws-sdk/client-sqs`, pinned in tests/sqs/js/package-lock.json and installed by `make test`).

tests/sqs/js/sqs_suite.mjs runs the scenarios under Node and prints one JSON line per scenario;
this module starts the gateway on each store, issues it two access keys in two projects, runs the
script and fails naming every scenario that did not pass."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, Server
from tests.js_suites import node_with, run_suite
from tests.sqs import test_sqs_boto3
from tests.sqs.test_sqs_boto3 import make_key

pytestmark = pytest.mark.slow

REGION = "eu-west-3"  # any region is accepted; not the default, so the ARN shows it is the signed one
JS_DIR = ROOT / "tests" / "sqs" / "js"
SUITE = JS_DIR / "sqs_suite.mjs"
SDK = JS_DIR / "node_modules" / "@aws-sdk" / "client-sqs" / "package.json"
# Every scenario of sqs_suite.mjs: each must report, and report ok.
SCENARIOS = (
    "create_queue_idempotent",
    "get_queue_url",
    "list_queues_prefix",
    "send_receive_message_attributes",
    "send_message_batch",
    "long_poll_woken_by_send",
    "visibility_zero_and_receive_count",
    "delete_message_batch",
    "change_message_visibility_batch",
    "purge_queue",
    "tags",
    "queue_attributes",
    "delete_queue",
    "queue_url_as_endpoint",
    "wrong_secret",
    "other_project_queue",
    "dlq_redrive",
    "fifo_order_dedup",
)
SUITE_TIMEOUT_S = 300.0  # ~15 s when all is well; each scenario bounds itself at 60 s


@pytest.fixture(scope="module")
def node() -> str:
    return node_with(SDK, JS_DIR)


srv = test_sqs_boto3.srv  # the same gateways, one per store


def test_js_sdk_v3(node: str, srv: Server) -> None:
    key = make_key(srv, "js-app", "sqsjs1")
    other = make_key(srv, "js-other", "sqsjs2")
    assert key["account"] != other["account"]
    sdk_version = json.loads(SDK.read_text())["version"]
    command = [
        node,
        str(SUITE),
        "--endpoint", srv.url,
        "--region", REGION,
        "--key-id", key["accessKeyId"],
        "--secret", key["secretAccessKey"],
        "--other-key-id", other["accessKeyId"],
        "--other-secret", other["secretAccessKey"],
    ]  # fmt: skip
    run_suite(command, JS_DIR, f"@aws-sdk/client-sqs {sdk_version}", SCENARIOS, srv, SUITE_TIMEOUT_S)
