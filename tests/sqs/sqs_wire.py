"""botocore's own clients, serializers and parsers for the SQS wire tests, in both protocols.

botocore 1.44 models SQS in the AWS JSON 1.0 protocol only. The query protocol's model is the
same one with the query names put back: each flattened list's item name and each map's entry
names (`locationName` in botocore's model, as botocore's last query model for SQS, 1.34.x, has
them), `resultWrapper` on each output and the XML namespace.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import botocore.session
from botocore.awsrequest import AWSResponse
from botocore.config import Config
from botocore.loaders import Loader

SQS_XMLNS = "http://queue.amazonaws.com/doc/2012-11-05/"
# shape → {"member": item name} for lists, {"key", "value"} names for maps, member → name.
_LIST_ITEMS = {
    "AWSAccountIdList": "AWSAccountId",
    "ActionNameList": "ActionName",
    "AttributeNameList": "AttributeName",
    "BatchResultErrorEntryList": "BatchResultErrorEntry",
    "BinaryList": "BinaryListValue",
    "StringList": "StringListValue",
    "ChangeMessageVisibilityBatchRequestEntryList": "ChangeMessageVisibilityBatchRequestEntry",
    "ChangeMessageVisibilityBatchResultEntryList": "ChangeMessageVisibilityBatchResultEntry",
    "DeleteMessageBatchRequestEntryList": "DeleteMessageBatchRequestEntry",
    "DeleteMessageBatchResultEntryList": "DeleteMessageBatchResultEntry",
    "SendMessageBatchRequestEntryList": "SendMessageBatchRequestEntry",
    "SendMessageBatchResultEntryList": "SendMessageBatchResultEntry",
    "ListMessageMoveTasksResultEntryList": "ListMessageMoveTasksResultEntry",
    "MessageAttributeNameList": "MessageAttributeName",
    "MessageSystemAttributeList": "MessageSystemAttributeName",
    "MessageList": "Message",
    "QueueUrlList": "QueueUrl",
    "TagKeyList": "TagKey",
}
_MAP_NAMES = {
    "QueueAttributeMap": ("Name", "Value"),
    "MessageSystemAttributeMap": ("Name", "Value"),
    "MessageBodyAttributeMap": ("Name", "Value"),
    "MessageBodySystemAttributeMap": ("Name", "Value"),
    "TagMap": ("Key", "Value"),
}
# Maps named at the shape (so wherever they are a member), as in botocore 1.34's model.
_MAP_LOCATIONS = {"QueueAttributeMap": "Attribute", "MessageSystemAttributeMap": "Attribute", "TagMap": "Tag"}
_MEMBER_NAMES = {
    ("CreateQueueRequest", "Attributes"): "Attribute",
    ("CreateQueueRequest", "tags"): "Tag",
    ("SetQueueAttributesRequest", "Attributes"): "Attribute",
    ("GetQueueAttributesResult", "Attributes"): "Attribute",
    ("ListQueueTagsResult", "Tags"): "Tag",
    ("Message", "Attributes"): "Attribute",
    ("Message", "MessageAttributes"): "MessageAttribute",
    ("SendMessageRequest", "MessageAttributes"): "MessageAttribute",
    ("SendMessageRequest", "MessageSystemAttributes"): "MessageSystemAttribute",
    ("SendMessageBatchRequestEntry", "MessageAttributes"): "MessageAttribute",
    ("SendMessageBatchRequestEntry", "MessageSystemAttributes"): "MessageSystemAttribute",
    ("MessageAttributeValue", "StringListValues"): "StringListValue",
    ("MessageAttributeValue", "BinaryListValues"): "BinaryListValue",
    ("MessageSystemAttributeValue", "StringListValues"): "StringListValue",
    ("MessageSystemAttributeValue", "BinaryListValues"): "BinaryListValue",
}


def json_model() -> dict[str, Any]:
    return Loader().load_service_model("sqs", "service-2")  # type: ignore[no-any-return]


def query_model() -> dict[str, Any]:
    model = copy.deepcopy(json_model())
    meta = model["metadata"]
    meta["protocol"] = "query"
    meta["protocols"] = ["query"]
    meta["xmlNamespace"] = SQS_XMLNS
    meta.pop("jsonVersion", None)
    meta.pop("targetPrefix", None)
    for name, op in model["operations"].items():
        if "output" in op:
            op["output"]["resultWrapper"] = f"{name}Result"
    shapes = model["shapes"]
    for shape_name, item in _LIST_ITEMS.items():
        shapes[shape_name]["member"]["locationName"] = item
    for shape_name, (key, value) in _MAP_NAMES.items():
        shapes[shape_name]["key"]["locationName"] = key
        shapes[shape_name]["value"]["locationName"] = value
    for shape_name, location in _MAP_LOCATIONS.items():
        shapes[shape_name]["locationName"] = location
    for (shape_name, member), location in _MEMBER_NAMES.items():
        shapes[shape_name]["members"][member]["locationName"] = location
    return model


def _session(protocol: str, tmp: Path | None, service: str) -> botocore.session.Session:
    session = botocore.session.get_session()
    if protocol == "query" and service == "sqs":
        assert tmp is not None
        where = tmp / "sqs" / "2012-11-05"
        where.mkdir(parents=True, exist_ok=True)
        (where / "service-2.json").write_text(json.dumps(query_model()))
        session.get_component("data_loader").search_paths.insert(0, str(tmp))
    return session


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Any:
        yield self._body


def client(protocol: str, answer: Any, tmp: Path | None = None, service: str = "sqs") -> Any:
    """A botocore client whose every request goes to `answer(request) -> (status, headers,
    body)` instead of the network: `request` is the prepared request (method, url, headers, body)."""
    session = _session(protocol, tmp, service)
    made = session.create_client(
        service,
        region_name="us-east-1",
        endpoint_url="http://127.0.0.1:1",
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="secret",
        config=Config(retries={"total_max_attempts": 1}),
    )

    def before_send(request: Any, **_: Any) -> AWSResponse:
        status, headers, body = answer(request)
        return AWSResponse(request.url, status, headers, _Raw(body))

    made.meta.events.register("before-send", before_send)
    return made
