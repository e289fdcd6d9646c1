"""Queue actions' errors as AWS answers them (names, types, attributes, tags, lists), down
to codes and message texts, driven by boto3 against the real gateway; and the query
protocol's empty lists and wording where it differs.

The expected answers are AWS's recorded ones for the same calls.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from tests.unit.gateway.sqs_support import INVALID, SqsServer, error, unique

NS = {"q": "http://queue.amazonaws.com/doc/2012-11-05/"}
NAME_RULE = "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"


def query(server: SqsServer, fields: list[tuple[str, str]]) -> tuple[int, ET.Element]:
    """A raw query-protocol POST: the status and the parsed XML reply."""
    data = urllib.parse.urlencode(fields).encode()
    request = urllib.request.Request(server.url + "/", data=data)
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, ET.fromstring(resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, ET.fromstring(exc.read())


# ---------------------------------------------------------------- names and types


@pytest.mark.parametrize("name", ["", "p" * 85, "/my/test", "!@£$%^&*()queue", "q.fifo"])
def test_bad_queue_names_in_sqs_words(sqs: Any, name: str) -> None:
    assert error(sqs.create_queue, QueueName=name) == (*INVALID, NAME_RULE)


def test_fifo_attributes_on_standard_queues_in_sqs_words(sqs: Any) -> None:
    name = unique()
    for attributes, message in [
        ({"FifoQueue": "false"}, "Unknown Attribute FifoQueue."),
        ({"ContentBasedDeduplication": "false"}, "Unknown Attribute ContentBasedDeduplication."),
        (
            {"DeduplicationScope": "queue"},
            "You can specify the DeduplicationScope only when FifoQueue is set to true.",
        ),
        (
            {"FifoThroughputLimit": "perQueue"},
            "You can specify the FifoThroughputLimit only when FifoQueue is set to true.",
        ),
    ]:
        refused = error(sqs.create_queue, QueueName=name, Attributes=attributes)
        assert refused == ("InvalidAttributeName", "InvalidAttributeName", message)
    assert error(sqs.create_queue, QueueName=name, Attributes={"FifoQueue": "true"}) == (
        *INVALID,
        "The name of a FIFO queue can only include alphanumeric characters, hyphens, or "
        "underscores, must end with .fifo suffix and be 1 to 80 in length.",
    )


def test_the_queue_type_cannot_be_set(sqs: Any) -> None:
    standard = sqs.create_queue(QueueName=unique())["QueueUrl"]
    for value in ("true", "false"):
        refused = error(
            sqs.set_queue_attributes, QueueUrl=standard, Attributes={"FifoQueue": value}
        )
        assert refused == (
            "InvalidAttributeName",
            "InvalidAttributeName",
            "Unknown Attribute FifoQueue.",
        )
    fifo = sqs.create_queue(QueueName=unique(fifo=True), Attributes={"FifoQueue": "true"})[
        "QueueUrl"
    ]
    sqs.set_queue_attributes(QueueUrl=fifo, Attributes={"FifoQueue": "true"})
    assert error(sqs.set_queue_attributes, QueueUrl=fifo, Attributes={"FifoQueue": "false"}) == (
        "InvalidAttributeValue",
        "InvalidAttributeValue",
        "Invalid value for the parameter FifoQueue. Reason: Modifying queue type is not supported.",
    )


def test_queue_already_exists_names_the_attribute_that_differs(sqs: Any) -> None:
    name = unique()
    url = sqs.create_queue(
        QueueName=name, Attributes={"ReceiveMessageWaitTimeSeconds": "1", "DelaySeconds": "1"}
    )["QueueUrl"]
    assert sqs.create_queue(QueueName=name)["QueueUrl"] == url
    assert sqs.create_queue(QueueName=name, Attributes={"DelaySeconds": "1"})["QueueUrl"] == url
    exists = ("QueueAlreadyExists", "QueueNameExists")
    message = "A queue already exists with the same name and a different value for attribute "
    for attributes in (
        {"DelaySeconds": "2"},
        {"ReceiveMessageWaitTimeSeconds": "1", "DelaySeconds": "2"},
    ):
        assert error(sqs.create_queue, QueueName=name, Attributes=attributes) == (
            *exists,
            message + "DelaySeconds",
        )
    fifo = unique(fifo=True)
    sqs.create_queue(
        QueueName=fifo, Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"}
    )
    other = {"FifoQueue": "true", "ContentBasedDeduplication": "false"}
    assert error(sqs.create_queue, QueueName=fifo, Attributes=other) == (
        *exists,
        message + "ContentBasedDeduplication",
    )
    with pytest.raises(sqs.exceptions.QueueNameExists):
        sqs.create_queue(QueueName=fifo, Attributes=other)


# ---------------------------------------------------------------- attributes and tags


def test_an_empty_policy_removes_the_policy(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=unique())["QueueUrl"]
    policy = json.dumps({"Version": "2012-10-17", "Statement": []})
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": policy})
    shown = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])
    assert shown["Attributes"] == {"Policy": policy}
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": ""})
    assert "Attributes" not in sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": ""})  # none: still fine


def test_tag_errors_in_sqs_words(sqs: Any) -> None:
    name = unique()
    url = sqs.create_queue(QueueName=name, tags={"tag_key_1": "tag_value_X"})["QueueUrl"]
    assert error(sqs.tag_queue, QueueUrl=url, Tags={}) == (
        "MissingParameter",
        "MissingRequiredParameterException",
        "The request must contain the parameter Tags.",
    )
    too_many = {f"tag_key_{i}": f"tag_value_{i}" for i in range(51)}
    assert error(sqs.tag_queue, QueueUrl=url, Tags=too_many) == (
        *INVALID,
        f"Too many tags added for queue {name}.",
    )
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"tag_key_1": "tag_value_X"}
    for keys in ([], [""], ["k" * 129]):
        assert error(sqs.untag_queue, QueueUrl=url, TagKeys=keys) == (
            *INVALID,
            "Tag keys must be between 1 and 128 characters in length.",
        )


# ---------------------------------------------------------------- lists


def test_dead_letter_source_queues_page_in_both_protocols(sqs: Any, server: SqsServer) -> None:
    dlq = unique("dlq")
    dlq_url = sqs.create_queue(QueueName=dlq)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]
    policy = json.dumps({"deadLetterTargetArn": arn["QueueArn"], "maxReceiveCount": 3})
    sources = sorted(
        sqs.create_queue(QueueName=unique("src"), Attributes={"RedrivePolicy": policy})["QueueUrl"]
        for _ in range(5)
    )
    seen: list[str] = []
    token: dict[str, str] = {}
    while True:
        page = sqs.list_dead_letter_source_queues(QueueUrl=dlq_url, MaxResults=2, **token)
        assert len(page["queueUrls"]) <= 2
        seen += page["queueUrls"]
        if "NextToken" not in page:
            break
        token = {"NextToken": page["NextToken"]}
    assert seen == sources
    everything = sqs.list_dead_letter_source_queues(QueueUrl=dlq_url)
    assert (everything["queueUrls"], "NextToken" in everything) == (sources, False)
    assert (
        error(sqs.list_dead_letter_source_queues, QueueUrl=dlq_url, MaxResults=1001)[:2] == INVALID
    )
    fields = [("Action", "ListDeadLetterSourceQueues"), ("QueueUrl", dlq_url), ("MaxResults", "3")]
    status, root = query(server, fields)
    assert status == 200
    result = root.find("q:ListDeadLetterSourceQueuesResult", NS)
    assert result is not None
    assert [e.text for e in result.findall("q:QueueUrl", NS)] == sources[:3]
    next_token = result.findtext("q:NextToken", namespaces=NS)
    assert next_token
    status, root = query(server, [*fields, ("NextToken", next_token)])
    rest = root.find("q:ListDeadLetterSourceQueuesResult", NS)
    assert rest is not None
    assert [e.text for e in rest.findall("q:QueueUrl", NS)] == sources[3:]
    assert rest.findtext("q:NextToken", namespaces=NS) is None


# ---------------------------------------------------------------- the query protocol


def test_empty_lists_in_the_query_protocol_are_empty_not_malformed(
    sqs: Any, server: SqsServer
) -> None:
    url = sqs.create_queue(QueueName=unique())["QueueUrl"]
    # botocore sends an empty list as "Name=" with the member's name
    for fields in ([("Entries", "")], [("SendMessageBatchRequestEntry", "")], []):
        status, root = query(server, [("Action", "SendMessageBatch"), ("QueueUrl", url), *fields])
        assert status == 400
        assert root.findtext("q:Error/q:Code", namespaces=NS) == (
            "AWS.SimpleQueueService.EmptyBatchRequest"
        )
        assert root.findtext("q:Error/q:Message", namespaces=NS) == (
            "There should be at least one SendMessageBatchRequestEntry in the request."
        )
    status, root = query(server, [("Action", "UntagQueue"), ("QueueUrl", url), ("TagKeys", "")])
    assert (status, root.findtext("q:Error/q:Code", namespaces=NS)) == (
        400,
        "InvalidParameterValue",
    )


def test_a_missing_queue_is_worded_for_the_wsdl_version_in_the_query_protocol(
    server: SqsServer,
) -> None:
    fields = [("Action", "GetQueueAttributes"), ("QueueUrl", server.queue_url("nope"))]
    status, root = query(server, fields)
    assert status == 400
    assert (
        root.findtext("q:Error/q:Code", namespaces=NS) == "AWS.SimpleQueueService.NonExistentQueue"
    )
    assert root.findtext("q:Error/q:Message", namespaces=NS) == (
        "The specified queue does not exist for this wsdl version."
    )
