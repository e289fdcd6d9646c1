"""Bad input on both wire protocols, sent raw: every case must answer SQS's error in the
protocol it came in — JSON ``{"__type", "message"}`` with ``x-amzn-query-error``, or the
query protocol's XML ``ErrorResponse`` — with status 400 and the sender at fault."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any

import botocore.session
import pytest

from gateway.sqs.handler import ACTIONS
from tests.unit.gateway.sqs_support import SqsServer, client_of, running, unique

NS = {"q": "http://queue.amazonaws.com/doc/2012-11-05/"}
QUEUE = unique("errors")

# Query names of the JSON members these cases use.
_ENTRY_NAMES = {
    "SendMessageBatch": "SendMessageBatchRequestEntry",
    "DeleteMessageBatch": "DeleteMessageBatchRequestEntry",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqsServer]:
    with running(tmp_path_factory.mktemp("sqs")) as s, client_of(s) as sqs:
        sqs.create_queue(QueueName=QUEUE)
        yield s


def to_form(action: str, params: dict[str, Any]) -> list[tuple[str, str]]:
    """The query form of JSON-shaped parameters."""
    form = [("Action", action)]
    for name, value in params.items():
        if name == "Entries":
            for i, entry in enumerate(value, start=1):
                form += [(f"{_ENTRY_NAMES[action]}.{i}.{k}", str(v)) for k, v in entry.items()]
        elif name == "Attributes":
            for i, (k, v) in enumerate(value.items(), start=1):
                form += [(f"Attribute.{i}.Name", k), (f"Attribute.{i}.Value", v)]
        elif name == "AttributeNames":
            form += [(f"AttributeName.{i}", v) for i, v in enumerate(value, start=1)]
        else:
            form.append((name, str(value)))
    return form


def send(
    server: SqsServer, protocol: str, action: str, params: dict[str, Any]
) -> tuple[int, dict[str, str], bytes]:
    if protocol == "json":
        data = json.dumps(params).encode()
        headers = {
            "Content-Type": "application/x-amz-json-1.0",
            "X-Amz-Target": f"AmazonSQS.{action}",
        }
    else:
        data = urllib.parse.urlencode(to_form(action, params)).encode()
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
    request = urllib.request.Request(server.url + "/", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, dict(exc.headers), exc.read()


def url(server: SqsServer, name: str = QUEUE) -> str:
    return server.queue_url(name)


# (label, action, params (a callable of the server), JSON type, query code)
CASES: list[tuple[str, str, Any, str, str]] = [
    (
        "missing queue url",
        "SendMessage",
        lambda s: {"MessageBody": "x"},
        "MissingRequiredParameterException",
        "MissingParameter",
    ),
    (
        "missing body",
        "SendMessage",
        lambda s: {"QueueUrl": url(s)},
        "MissingRequiredParameterException",
        "MissingParameter",
    ),
    (
        "missing queue name",
        "CreateQueue",
        lambda s: {},
        "MissingRequiredParameterException",
        "MissingParameter",
    ),
    (
        "invalid max",
        "ReceiveMessage",
        lambda s: {"QueueUrl": url(s), "MaxNumberOfMessages": 0},
        "InvalidParameterValueException",
        "InvalidParameterValue",
    ),
    (
        "invalid visibility",
        "ReceiveMessage",
        lambda s: {"QueueUrl": url(s), "VisibilityTimeout": "soon"},
        "InvalidParameterValueException",
        "InvalidParameterValue",
    ),
    (
        "unknown queue",
        "SendMessage",
        lambda s: {"QueueUrl": url(s, "no-such-queue"), "MessageBody": "x"},
        "QueueDoesNotExist",
        "AWS.SimpleQueueService.NonExistentQueue",
    ),
    (
        "a bare name of no queue",
        "PurgeQueue",
        lambda s: {"QueueUrl": "no-such-queue"},
        "QueueDoesNotExist",
        "AWS.SimpleQueueService.NonExistentQueue",
    ),
    (
        "a url that names no queue",
        "PurgeQueue",
        lambda s: {"QueueUrl": "http://whatever-incorrect-queue-address"},
        "QueueDoesNotExist",
        "AWS.SimpleQueueService.NonExistentQueue",
    ),
    (
        "too many entries",
        "SendMessageBatch",
        lambda s: {
            "QueueUrl": url(s),
            "Entries": [{"Id": str(i), "MessageBody": "x"} for i in range(11)],
        },
        "TooManyEntriesInBatchRequest",
        "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
    ),
    (
        "empty batch",
        "SendMessageBatch",
        lambda s: {"QueueUrl": url(s), "Entries": []},
        "EmptyBatchRequest",
        "AWS.SimpleQueueService.EmptyBatchRequest",
    ),
    (
        "duplicate entry ids",
        "DeleteMessageBatch",
        lambda s: {
            "QueueUrl": url(s),
            "Entries": [{"Id": "a", "ReceiptHandle": "h"}, {"Id": "a", "ReceiptHandle": "h"}],
        },
        "BatchEntryIdsNotDistinct",
        "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
    ),
    (
        "oversized message",
        "SendMessage",
        lambda s: {"QueueUrl": url(s), "MessageBody": "x" * (1024 * 1024 + 1)},
        "InvalidParameterValueException",
        "InvalidParameterValue",
    ),
    (
        "bad receipt handle",
        "DeleteMessage",
        lambda s: {"QueueUrl": url(s), "ReceiptHandle": "definitely-not-a-handle"},
        "ReceiptHandleIsInvalid",
        "ReceiptHandleIsInvalid",
    ),
    (
        "bad visibility on a handle",
        "ChangeMessageVisibility",
        lambda s: {"QueueUrl": url(s), "ReceiptHandle": "evq1.AAAA", "VisibilityTimeout": 99999},
        "InvalidParameterValueException",
        "InvalidParameterValue",
    ),
    (
        "unknown queue attribute",
        "GetQueueAttributes",
        lambda s: {"QueueUrl": url(s), "AttributeNames": ["Colour"]},
        "InvalidAttributeName",
        "InvalidAttributeName",
    ),
    (
        "bad queue attribute value",
        "SetQueueAttributes",
        lambda s: {"QueueUrl": url(s), "Attributes": {"DelaySeconds": "-1"}},
        "InvalidAttributeValue",
        "InvalidAttributeValue",
    ),
    (
        "bad queue name",
        "CreateQueue",
        lambda s: {"QueueName": "spaces are bad"},
        "InvalidParameterValueException",
        "InvalidParameterValue",
    ),
]


@pytest.mark.parametrize("protocol", ["json", "query"])
@pytest.mark.parametrize(
    ("action", "params", "json_type", "query_code"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_bad_input_gets_sqs_errors_in_both_protocols(
    server: SqsServer, protocol: str, action: str, params: Any, json_type: str, query_code: str
) -> None:
    status, headers, body = send(server, protocol, action, params(server))
    assert status == 400, body
    lower = {k.lower(): v for k, v in headers.items()}
    assert lower["x-amzn-requestid"]
    if protocol == "json":
        assert lower["content-type"].startswith("application/x-amz-json-1.0")
        doc = json.loads(body)
        assert doc["__type"] == f"com.amazonaws.sqs#{json_type}"
        assert doc["message"]
        assert lower["x-amzn-query-error"] == f"{query_code};Sender"
    else:
        assert lower["content-type"].startswith("text/xml")
        root = ET.fromstring(body)
        assert root.tag == f"{{{NS['q']}}}ErrorResponse"
        assert root.findtext("q:Error/q:Code", namespaces=NS) == query_code
        assert root.findtext("q:Error/q:Type", namespaces=NS) == "Sender"
        assert root.findtext("q:Error/q:Message", namespaces=NS)
        assert root.findtext("q:RequestId", namespaces=NS) == lower["x-amzn-requestid"]


def test_unknown_actions_in_each_protocol(server: SqsServer) -> None:
    status, _, body = send(server, "json", "ReticulateSplines", {})
    assert status == 400
    assert json.loads(body)["__type"].endswith("#UnknownOperationException")
    status, _, body = send(server, "query", "ReticulateSplines", {})
    assert status == 400
    assert ET.fromstring(body).findtext("q:Error/q:Code", namespaces=NS) == "InvalidAction"


def test_every_action_of_the_sdks_service_model_is_served() -> None:
    model = botocore.session.get_session().get_service_model("sqs")
    assert set(model.operation_names) <= set(ACTIONS)


def test_a_body_that_is_no_request_is_refused(server: SqsServer) -> None:
    headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues"}
    for data in (b"{not json", b"[]"):
        request = urllib.request.Request(server.url + "/", data=data, headers=headers)
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=30)
        with info.value as error:
            assert error.code == 400
            assert json.loads(error.read())["__type"].endswith("#SerializationException")
    request = urllib.request.Request(server.url + "/", data=b"QueueName=q")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=30)
    with info.value as error:
        code = ET.fromstring(error.read()).findtext("q:Error/q:Code", namespaces=NS)
    assert code == "MissingAction"


def test_the_native_api_is_untouched_by_the_sqs_routes(server: SqsServer) -> None:
    request = urllib.request.Request(server.url + "/v1/queues", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=30)
    with info.value as error:
        assert error.code == 405  # not taken for a queue URL: accounts are 12 digits
