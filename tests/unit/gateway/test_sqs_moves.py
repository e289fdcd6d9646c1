"""Message move tasks through boto3 against the real gateway: a dead-letter queue redriven
back to its sources or to a named queue, listed, cancelled, and resumed after a restart;
errors as AWS words them (its recorded answers)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from gateway.sqs.moves import encode_handle
from tests.unit.gateway.sqs_support import SqsServer, client_of, running, unique


def arn_of(sqs: Any, url: str) -> str:
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
    return str(attrs["Attributes"]["QueueArn"])


def pipe(sqs: Any, name: str) -> tuple[str, str]:
    """A queue whose messages are dead-lettered after one receive: (queue, dlq) URLs."""
    dlq = sqs.create_queue(QueueName=f"{name}-dlq")["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": arn_of(sqs, dlq), "maxReceiveCount": 1})
    url = sqs.create_queue(
        QueueName=name, Attributes={"RedrivePolicy": policy, "VisibilityTimeout": "1"}
    )["QueueUrl"]
    return url, dlq


def dead_letter(sqs: Any, url: str, dlq: str, n: int) -> list[str]:
    """Send ``n`` messages to ``url`` and let them move to ``dlq``; their ids."""
    ids = [sqs.send_message(QueueUrl=url, MessageBody=f"m{i}")["MessageId"] for i in range(n)]
    got = 0
    while got < n:
        got += len(sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []))
    deadline = time.monotonic() + 20
    while visible(sqs, dlq) < n:
        assert time.monotonic() < deadline, "the dead letters did not arrive"
        time.sleep(0.1)
    return ids


def visible(sqs: Any, url: str) -> int:
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(attrs["Attributes"]["ApproximateNumberOfMessages"])


def tasks(sqs: Any, source_arn: str, n: int = 1) -> list[dict[str, Any]]:
    return list(sqs.list_message_move_tasks(SourceArn=source_arn, MaxResults=n)["Results"])


def finished(sqs: Any, source_arn: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        [task] = tasks(sqs, source_arn)
        if task["Status"] not in ("RUNNING", "CANCELLING"):
            return task
        assert time.monotonic() < deadline, task
        time.sleep(0.1)


def error(call: Any, **kwargs: Any) -> tuple[str, str, int]:
    with pytest.raises(ClientError) as info:
        call(**kwargs)
    response = info.value.response
    return (
        response["Error"]["Code"],
        response["Error"]["Message"],
        response["ResponseMetadata"]["HTTPStatusCode"],
    )


def test_a_redrive_moves_every_dead_letter_back_with_its_id(sqs: Any) -> None:
    url, dlq = pipe(sqs, unique("redrive"))
    ids = dead_letter(sqs, url, dlq, 5)
    dlq_arn = arn_of(sqs, dlq)
    handle = sqs.start_message_move_task(SourceArn=dlq_arn)["TaskHandle"]
    assert isinstance(handle, str)
    task = finished(sqs, dlq_arn)
    assert task["Status"] == "COMPLETED"
    assert (
        task["ApproximateNumberOfMessagesMoved"] == task["ApproximateNumberOfMessagesToMove"] == 5
    )
    assert task["SourceArn"] == dlq_arn
    assert "TaskHandle" not in task
    assert "DestinationArn" not in task
    assert abs(task["StartedTimestamp"] - time.time() * 1000) < 60_000
    back = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"])
    moved = back["Messages"]
    assert sorted(m["MessageId"] for m in moved) == sorted(ids)
    assert all("DeadLetterQueueSourceArn" not in m["Attributes"] for m in moved)
    assert visible(sqs, dlq) == 0


def test_a_named_destination_a_rate_and_a_cancel(sqs: Any) -> None:
    url, dlq = pipe(sqs, unique("cancel"))
    elsewhere = sqs.create_queue(QueueName=unique("elsewhere"))["QueueUrl"]
    dead_letter(sqs, url, dlq, 10)
    dlq_arn, elsewhere_arn = arn_of(sqs, dlq), arn_of(sqs, elsewhere)
    handle = sqs.start_message_move_task(
        SourceArn=dlq_arn, DestinationArn=elsewhere_arn, MaxNumberOfMessagesPerSecond=2
    )["TaskHandle"]
    assert error(sqs.start_message_move_task, SourceArn=dlq_arn) == (
        "InvalidParameterValue",
        "There is already a task running. Only one active task is allowed for a source queue "
        "arn at a given time.",
        400,
    )
    time.sleep(1.2)
    [running_task] = tasks(sqs, dlq_arn)
    assert running_task["Status"] == "RUNNING"
    assert running_task["TaskHandle"] == handle
    assert running_task["DestinationArn"] == elsewhere_arn
    assert running_task["MaxNumberOfMessagesPerSecond"] == 2
    assert 1 <= running_task["ApproximateNumberOfMessagesMoved"] < 10  # 2 per second
    moved = sqs.cancel_message_move_task(TaskHandle=handle)["ApproximateNumberOfMessagesMoved"]
    task = finished(sqs, dlq_arn)
    assert task["Status"] == "CANCELLED"
    assert moved <= task["ApproximateNumberOfMessagesMoved"] < 10
    assert visible(sqs, elsewhere) == task["ApproximateNumberOfMessagesMoved"]
    assert visible(sqs, dlq) == 10 - task["ApproximateNumberOfMessagesMoved"]
    assert visible(sqs, url) == 0
    # a task that ended cannot be cancelled again; the newest task is listed first
    assert error(sqs.cancel_message_move_task, TaskHandle=handle)[0] == "InvalidParameterValue"
    sqs.start_message_move_task(SourceArn=dlq_arn)
    finished(sqs, dlq_arn)
    assert [t["Status"] for t in tasks(sqs, dlq_arn, 10)] == ["COMPLETED", "CANCELLED"]


def test_a_deleted_destination_fails_the_task(sqs: Any) -> None:
    url, dlq = pipe(sqs, unique("gone"))
    dead_letter(sqs, url, dlq, 2)
    sqs.delete_queue(QueueUrl=url)
    dlq_arn = arn_of(sqs, dlq)
    other, _ = pipe(sqs, unique("other"))  # the dlq must still be some queue's dlq
    sqs.set_queue_attributes(
        QueueUrl=other,
        Attributes={
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1})
        },
    )
    sqs.start_message_move_task(SourceArn=dlq_arn)
    task = finished(sqs, dlq_arn)
    assert task["Status"] == "FAILED"
    assert task["FailureReason"] == "AWS.SimpleQueueService.NonExistentQueue"
    assert visible(sqs, dlq) == 2


def test_move_task_errors_as_aws_words_them(server: SqsServer, sqs: Any) -> None:
    plain = sqs.create_queue(QueueName=unique("plain"))["QueueUrl"]
    plain_arn = arn_of(sqs, plain)
    assert error(sqs.start_message_move_task, SourceArn=plain_arn) == (
        "InvalidParameterValue",
        "Source queue must be configured as a Dead Letter Queue.",
        400,
    )
    _, dlq = pipe(sqs, unique("errors"))
    missing = plain_arn + "-doesnotexist"
    assert error(
        sqs.start_message_move_task, SourceArn=arn_of(sqs, dlq), DestinationArn=missing
    ) == (
        "ResourceNotFoundException",
        "The resource that you specified for the DestinationArn parameter doesn't exist.",
        404,
    )
    assert error(sqs.list_message_move_tasks, SourceArn=missing)[0] == "ResourceNotFoundException"
    assert error(sqs.cancel_message_move_task, TaskHandle="foobared") == (
        "InvalidParameterValue",
        "Value for parameter TaskHandle is invalid.",
        400,
    )
    unknown_task = encode_handle("10f57157-fc38-4da9-a113-4de7e12d05aa", arn_of(sqs, dlq))
    assert error(sqs.cancel_message_move_task, TaskHandle=unknown_task) == (
        "ResourceNotFoundException",
        "Task does not exist.",
        404,
    )
    unknown_queue = encode_handle("x", missing)
    assert error(sqs.cancel_message_move_task, TaskHandle=unknown_queue)[:2] == (
        "ResourceNotFoundException",
        "The resource that you specified for the SourceArn parameter doesn't exist.",
    )
    assert sqs.list_message_move_tasks(SourceArn=arn_of(sqs, dlq))["Results"] == []
    assert (
        error(
            sqs.start_message_move_task,
            SourceArn=arn_of(sqs, dlq),
            MaxNumberOfMessagesPerSecond=501,
        )[0]
        == "InvalidParameterValue"
    )


def test_a_task_goes_on_after_the_server_restarts(tmp_path: Path) -> None:
    with running(tmp_path) as first, client_of(first) as sqs:
        url, dlq = pipe(sqs, "restart")
        ids = dead_letter(sqs, url, dlq, 8)
        dlq_arn = arn_of(sqs, dlq)
        sqs.start_message_move_task(SourceArn=dlq_arn, MaxNumberOfMessagesPerSecond=4)
        time.sleep(0.6)
        assert tasks(sqs, dlq_arn)[0]["Status"] == "RUNNING"
    with running(tmp_path) as second, client_of(second) as sqs:
        task = finished(sqs, dlq_arn)
        assert task["Status"] == "COMPLETED"
        assert task["ApproximateNumberOfMessagesMoved"] == 8
        seen: list[str] = []
        deadline = time.monotonic() + 90  # a step cut off by the stop: back after its lease
        while len(seen) < 8 and time.monotonic() < deadline:
            got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
            for m in got.get("Messages", []):
                seen.append(m["MessageId"])
                sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        assert sorted(seen) == sorted(ids)  # each once
