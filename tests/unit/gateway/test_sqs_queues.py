"""Queue actions of the SQS API, driven by boto3 against the real gateway on 127.0.0.1.

CreateQueue, GetQueueUrl, ListQueues (prefix, pagination), DeleteQueue, GetQueueAttributes,
SetQueueAttributes, PurgeQueue, TagQueue, UntagQueue, ListQueueTags,
ListDeadLetterSourceQueues; attributes and tags surviving a restart of the server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from actors.clock import SystemClock
from tests.unit.gateway.sqs_support import (
    ACCOUNT,
    REGION,
    SqsServer,
    client_of,
    error_code,
    native,
    running,
    unique,
)


def fails(call: Any, **kwargs: Any) -> tuple[str, str]:
    with pytest.raises(ClientError) as info:
        call(**kwargs)
    return error_code(info.value)


def test_create_queue_answers_its_url_and_creates_it_once(sqs: Any, server: SqsServer) -> None:
    name = unique()
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    assert url == f"{server.url}/{ACCOUNT}/{name}"
    assert sqs.create_queue(QueueName=name)["QueueUrl"] == url  # the same again: fine
    attrs = {"VisibilityTimeout": "7"}
    other = unique()
    sqs.create_queue(QueueName=other, Attributes=attrs)
    assert sqs.create_queue(QueueName=other, Attributes=attrs)["QueueUrl"].endswith(other)
    assert fails(sqs.create_queue, QueueName=other, Attributes={"VisibilityTimeout": "8"}) == (
        "QueueNameExists",
        "QueueAlreadyExists",
    )
    assert native(server, "GET", f"/v1/queues/{name}")["name"] == name  # a real evq queue


def test_create_queue_refuses_bad_names_and_fifo_mismatches(sqs: Any) -> None:
    assert fails(sqs.create_queue, QueueName="bad name")[1] == "InvalidParameterValue"
    assert fails(sqs.create_queue, QueueName="x" * 81)[1] == "InvalidParameterValue"
    assert fails(sqs.create_queue, QueueName="__evq-mine")[1] == "InvalidParameterValue"
    assert fails(sqs.create_queue, QueueName=unique(fifo=True))[1] == "InvalidParameterValue"
    attrs = {"FifoQueue": "true"}
    assert fails(sqs.create_queue, QueueName=unique(), Attributes=attrs)[1] == (
        "InvalidParameterValue"
    )
    assert fails(sqs.create_queue, QueueName=unique(), Attributes={"Colour": "red"}) == (
        "InvalidAttributeName",
        "InvalidAttributeName",
    )
    bad_value = {"VisibilityTimeout": "43201"}
    assert fails(sqs.create_queue, QueueName=unique(), Attributes=bad_value)[1] == (
        "InvalidAttributeValue"
    )


def test_get_queue_url_finds_existing_queues_only(sqs: Any) -> None:
    name = unique()
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    assert sqs.get_queue_url(QueueName=name)["QueueUrl"] == url
    assert sqs.get_queue_url(QueueName=name, QueueOwnerAWSAccountId=ACCOUNT)["QueueUrl"] == url
    missing = ("QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue")
    assert fails(sqs.get_queue_url, QueueName=unique("never")) == missing
    assert fails(sqs.get_queue_url, QueueName=name, QueueOwnerAWSAccountId="123456789012") == (
        missing
    )


def test_list_queues_filters_by_prefix_and_pages(sqs: Any, server: SqsServer) -> None:
    prefix = unique("listing")
    names = sorted(f"{prefix}-{i}" for i in range(5))
    for name in names:
        sqs.create_queue(QueueName=name)
    everything = sqs.list_queues(QueueNamePrefix=prefix)
    assert everything["QueueUrls"] == [server.queue_url(n) for n in names]
    assert "NextToken" not in everything
    first = sqs.list_queues(QueueNamePrefix=prefix, MaxResults=2)
    assert first["QueueUrls"] == [server.queue_url(n) for n in names[:2]]
    pages = sqs.get_paginator("list_queues").paginate(
        QueueNamePrefix=prefix, PaginationConfig={"PageSize": 2}
    )
    seen = [url for page in pages for url in page["QueueUrls"]]
    assert seen == [server.queue_url(n) for n in names]
    assert "QueueUrls" not in sqs.list_queues(QueueNamePrefix=unique("nothing"))
    assert fails(sqs.list_queues, MaxResults=1001)[1] == "InvalidParameterValue"


def test_delete_queue_removes_it(sqs: Any) -> None:
    name = unique()
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="x")
    sqs.delete_queue(QueueUrl=url)
    missing = ("QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue")
    assert fails(sqs.get_queue_url, QueueName=name) == missing
    assert fails(sqs.send_message, QueueUrl=url, MessageBody="x") == missing
    assert fails(sqs.delete_queue, QueueUrl=url) == missing


def test_queue_attributes_round_trip(sqs: Any, server: SqsServer) -> None:
    dlq = sqs.create_queue(QueueName=unique("dlq"))["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    name = unique()
    policy = json.dumps({"Version": "2012-10-17", "Statement": []})
    redrive = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 3})
    url = sqs.create_queue(
        QueueName=name,
        Attributes={
            "VisibilityTimeout": "45",
            "DelaySeconds": "2",
            "MaximumMessageSize": "4096",
            "MessageRetentionPeriod": "3600",
            "ReceiveMessageWaitTimeSeconds": "1",
            "RedrivePolicy": redrive,
            "Policy": policy,
        },
    )["QueueUrl"]
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert got["QueueArn"] == f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"
    assert dlq_arn == f"arn:aws:sqs:{REGION}:{ACCOUNT}:{dlq.rsplit('/', 1)[1]}"
    expected = {
        "VisibilityTimeout": "45",
        "DelaySeconds": "2",
        "MaximumMessageSize": "4096",
        "MessageRetentionPeriod": "3600",
        "ReceiveMessageWaitTimeSeconds": "1",
        "Policy": policy,
        "ApproximateNumberOfMessages": "0",
        "ApproximateNumberOfMessagesNotVisible": "0",
        "ApproximateNumberOfMessagesDelayed": "0",
    }
    assert {k: got[k] for k in expected} == expected
    assert json.loads(got["RedrivePolicy"]) == {
        "deadLetterTargetArn": dlq_arn,
        "maxReceiveCount": 3,
    }
    assert int(got["CreatedTimestamp"]) == int(got["LastModifiedTimestamp"]) > 1_600_000_000
    assert "FifoQueue" not in got  # a standard queue
    sqs.set_queue_attributes(
        QueueUrl=url, Attributes={"VisibilityTimeout": "5", "RedrivePolicy": ""}
    )
    some = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["VisibilityTimeout", "RedrivePolicy", "DelaySeconds"]
    )["Attributes"]
    assert some == {"VisibilityTimeout": "5", "DelaySeconds": "2"}
    settings = native(server, "GET", f"/v1/queues/{name}")["settings"]
    assert (settings["visibility_timeout"], settings["dead_letter_queue"]) == (5.0, None)


def test_attribute_counts_follow_the_messages(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=unique())["QueueUrl"]
    for i in range(3):
        sqs.send_message(QueueUrl=url, MessageBody=f"m{i}")
    sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=60)
    sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1)
    names = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ]
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
    assert got == dict(zip(names, ["2", "1", "1"], strict=True))


def test_bad_attribute_names_and_values_are_refused(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=unique())["QueueUrl"]
    assert fails(sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["Colour"]) == (
        "InvalidAttributeName",
        "InvalidAttributeName",
    )
    for attrs in (
        {"QueueArn": "arn:aws:sqs:x:000000000000:y"},  # read-only
        {"FifoQueue": "true"},  # not changeable
        {"ContentBasedDeduplication": "true"},  # FIFO only
    ):
        assert fails(sqs.set_queue_attributes, QueueUrl=url, Attributes=attrs)[1] == (
            "InvalidAttributeName"
        )
    for attrs in (
        {"DelaySeconds": "901"},
        {"MessageRetentionPeriod": "59"},
        {"ReceiveMessageWaitTimeSeconds": "21"},
        {"Policy": "not json"},
    ):
        assert fails(sqs.set_queue_attributes, QueueUrl=url, Attributes=attrs)[1] == (
            "InvalidAttributeValue"
        ), attrs
    no_target = json.dumps(
        {
            "deadLetterTargetArn": f"arn:aws:sqs:{REGION}:{ACCOUNT}:{unique('nope')}",
            "maxReceiveCount": 2,
        }
    )
    assert (
        fails(sqs.set_queue_attributes, QueueUrl=url, Attributes={"RedrivePolicy": no_target})[1]
        == "InvalidParameterValue"
    )


def test_purge_queue_empties_it(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=unique())["QueueUrl"]
    sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": str(i)} for i in range(5)]
    )
    sqs.purge_queue(QueueUrl=url)
    assert sqs.receive_message(QueueUrl=url).get("Messages") is None
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    assert got["Attributes"]["ApproximateNumberOfMessages"] == "0"


class MovableClock(SystemClock):
    """The SQS face's clock, moved on by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.ahead_ms = 0

    def now_ms(self) -> int:
        return super().now_ms() + self.ahead_ms


def test_a_second_purge_within_60_seconds_is_refused_as_sqs_does(tmp_path: Path) -> None:
    clock = MovableClock()
    with running(tmp_path / "data", clock=clock) as server, client_of(server) as sqs:
        url = sqs.create_queue(QueueName=unique())["QueueUrl"]
        other = sqs.create_queue(QueueName=unique())["QueueUrl"]
        sqs.send_message(QueueUrl=url, MessageBody="a")
        sqs.purge_queue(QueueUrl=url)
        sqs.send_message(QueueUrl=url, MessageBody="b")
        with pytest.raises(ClientError) as info:
            sqs.purge_queue(QueueUrl=url)
        assert error_code(info.value)[0] == "PurgeQueueInProgress"
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        sqs.purge_queue(QueueUrl=other)  # per queue
        clock.ahead_ms = 59_000
        with pytest.raises(ClientError):
            sqs.purge_queue(QueueUrl=url)
        got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert got["ApproximateNumberOfMessages"] == "1"  # the refused purge deleted nothing
        assert "sqs.purged" not in json.dumps(got)
        clock.ahead_ms = 61_000
        sqs.purge_queue(QueueUrl=url)
        got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
        assert got["Attributes"]["ApproximateNumberOfMessages"] == "0"


def test_tags_are_added_listed_and_removed(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=unique(), tags={"team": "payments"})["QueueUrl"]
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "payments"}
    sqs.tag_queue(QueueUrl=url, Tags={"env": "dev", "team": "billing"})
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "billing", "env": "dev"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["team", "absent"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"env": "dev"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["env"])
    assert "Tags" not in sqs.list_queue_tags(QueueUrl=url)
    assert fails(sqs.tag_queue, QueueUrl=url, Tags={"aws:reserved": "x"})[1] == (
        "InvalidParameterValue"
    )
    too_many = {f"k{i}": "v" for i in range(51)}
    assert fails(sqs.tag_queue, QueueUrl=url, Tags=too_many)[1] == "InvalidParameterValue"


def test_dead_letter_source_queues_are_listed(sqs: Any) -> None:
    dlq = sqs.create_queue(QueueName=unique("dlq"))["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    redrive = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": "2"})
    sources = sorted(
        sqs.create_queue(QueueName=unique("src"), Attributes={"RedrivePolicy": redrive})["QueueUrl"]
        for _ in range(3)
    )
    sqs.create_queue(QueueName=unique("unrelated"))
    assert sorted(sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"]) == sources
    page = sqs.list_dead_letter_source_queues(QueueUrl=dlq, MaxResults=2)
    assert len(page["queueUrls"]) == 2
    rest = sqs.list_dead_letter_source_queues(
        QueueUrl=dlq, MaxResults=2, NextToken=page["NextToken"]
    )
    assert sorted(page["queueUrls"] + rest["queueUrls"]) == sources


def test_fifo_queues_show_their_fifo_attributes(sqs: Any) -> None:
    url = sqs.create_queue(
        QueueName=unique(fifo=True),
        Attributes={
            "FifoQueue": "true",
            "ContentBasedDeduplication": "true",
            "DeduplicationScope": "messageGroup",
            "FifoThroughputLimit": "perMessageGroupId",
        },
    )["QueueUrl"]
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert got["FifoQueue"] == "true"
    assert got["ContentBasedDeduplication"] == "true"
    assert got["DeduplicationScope"] == "messageGroup"
    assert got["FifoThroughputLimit"] == "perMessageGroupId"
    ext = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["evq.DeduplicationWindowSeconds"])
    assert ext["Attributes"] == {"evq.DeduplicationWindowSeconds": "300"}  # SQS's 5 minutes


def test_attributes_and_tags_survive_a_restart(tmp_path: Path) -> None:
    name = unique()
    with running(tmp_path / "data") as first, client_of(first) as sqs:
        url = sqs.create_queue(
            QueueName=name,
            Attributes={"VisibilityTimeout": "9", "ReceiveMessageWaitTimeSeconds": "3"},
            tags={"team": "x"},
        )["QueueUrl"]
        sqs.send_message(QueueUrl=url, MessageBody="kept")
    with running(tmp_path / "data") as second, client_of(second) as sqs:
        url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        attrs = sqs.get_queue_attributes(
            QueueUrl=url, AttributeNames=["VisibilityTimeout", "ReceiveMessageWaitTimeSeconds"]
        )["Attributes"]
        assert attrs == {"VisibilityTimeout": "9", "ReceiveMessageWaitTimeSeconds": "3"}
        assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "x"}
        [message] = sqs.receive_message(QueueUrl=url)["Messages"]
        assert message["Body"] == "kept"


def test_queues_created_natively_are_sqs_queues(sqs: Any, server: SqsServer) -> None:
    name = unique("native")
    native(server, "PUT", f"/v1/queues/{name}", {"visibility_timeout": 12})
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert got["VisibilityTimeout"] == "12"
    assert got["MaximumMessageSize"] == str(8 * 1024 * 1024)  # the queue's own limit
    assert "CreatedTimestamp" not in got  # evq keeps it only for queues SQS created
