"""FIFO queues through the SQS API (boto3, real gateway): strict order per group, a group
blocked while one of its messages is in flight, deduplication by id or content within the
window (SQS's five minutes, or evq's own), and SQS's FIFO errors."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.unit.gateway.sqs_support import error_code, unique


def fifo_queue(sqs: Any, **attributes: str) -> str:
    name = unique(fifo=True)
    attrs = {"FifoQueue": "true", **attributes}
    return sqs.create_queue(QueueName=name, Attributes=attrs)["QueueUrl"]  # type: ignore[no-any-return]


def send(sqs: Any, url: str, body: str, group: str, dedup: str | None = None) -> dict[str, Any]:
    kwargs = {"MessageDeduplicationId": dedup or body} if dedup != "" else {}
    return sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group, **kwargs)  # type: ignore[no-any-return]


def bodies(sqs: Any, url: str, **kwargs: Any) -> list[str]:
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, **kwargs).get(
        "Messages", []
    )
    return [m["Body"] for m in messages]


def test_groups_keep_their_order_and_block_while_in_flight(sqs: Any) -> None:
    url = fifo_queue(sqs)
    for body, group in [("a1", "A"), ("a2", "A"), ("b1", "B"), ("a3", "A"), ("b2", "B")]:
        send(sqs, url, body, group)
    first = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=2, AttributeNames=["All"])
    got = {m["Body"]: m for m in first["Messages"]}
    assert [m["Body"] for m in first["Messages"]] == ["a1", "a2"]  # a run of group A
    assert got["a1"]["Attributes"]["MessageGroupId"] == "A"
    assert got["a1"]["Attributes"]["MessageDeduplicationId"] == "a1"
    assert got["a1"]["Attributes"]["SequenceNumber"]
    more = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    got.update({m["Body"]: m for m in more})
    assert [m["Body"] for m in more] == ["b1", "b2"]  # A is blocked; B's run
    assert bodies(sqs, url) == []  # both groups are blocked
    sqs.delete_message(QueueUrl=url, ReceiptHandle=got["a2"]["ReceiptHandle"])
    assert bodies(sqs, url) == []  # a1 is still in flight
    sqs.delete_message(QueueUrl=url, ReceiptHandle=got["a1"]["ReceiptHandle"])
    assert bodies(sqs, url) == ["a3"]


def test_a_message_whose_visibility_expires_comes_back_before_the_rest_of_its_group(
    sqs: Any,
) -> None:
    url = fifo_queue(sqs)
    for body in ("m1", "m2"):
        send(sqs, url, body, "G")
    first = sqs.receive_message(QueueUrl=url, VisibilityTimeout=1)["Messages"]
    assert [m["Body"] for m in first] == ["m1"]
    time.sleep(1.2)
    again = sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["ApproximateReceiveCount"]
    )
    m1, m2 = again["Messages"]
    assert (m1["Body"], m1["Attributes"]["ApproximateReceiveCount"]) == ("m1", "2")
    assert (m2["Body"], m2["Attributes"]["ApproximateReceiveCount"]) == ("m2", "1")


def test_duplicates_within_the_window_are_dropped(sqs: Any) -> None:
    url = fifo_queue(sqs)
    first = send(sqs, url, "pay", "G", dedup="order-1")
    again = send(sqs, url, "pay", "G", dedup="order-1")
    assert again["MessageId"] == first["MessageId"]
    assert again["SequenceNumber"] == first["SequenceNumber"]
    assert again["MD5OfMessageBody"] == first["MD5OfMessageBody"]
    assert bodies(sqs, url) == ["pay"]
    window = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["evq.DeduplicationWindowSeconds"]
    )
    assert window["Attributes"]["evq.DeduplicationWindowSeconds"] == "300"


def test_a_shorter_evq_window_lets_the_same_id_in_again(sqs: Any) -> None:
    url = fifo_queue(sqs, **{"evq.DeduplicationWindowSeconds": "1"})
    first = send(sqs, url, "tick", "G", dedup="same")
    time.sleep(1.2)
    second = send(sqs, url, "tick", "G", dedup="same")
    assert second["MessageId"] != first["MessageId"]


def test_content_based_deduplication_uses_the_body(sqs: Any) -> None:
    url = fifo_queue(sqs, ContentBasedDeduplication="true")
    first = send(sqs, url, "same body", "G", dedup="")
    assert send(sqs, url, "same body", "G", dedup="")["MessageId"] == first["MessageId"]
    assert send(sqs, url, "other body", "G", dedup="")["MessageId"] != first["MessageId"]
    messages = sqs.receive_message(QueueUrl=url, AttributeNames=["MessageDeduplicationId"])
    [message] = messages["Messages"]
    digest = hashlib.sha256(b"same body").hexdigest()
    assert message["Attributes"]["MessageDeduplicationId"] == digest  # as SQS shows it


def test_message_group_scope_deduplicates_per_group(sqs: Any) -> None:
    url = fifo_queue(sqs, DeduplicationScope="messageGroup")
    a = send(sqs, url, "x", "A", dedup="d")
    b = send(sqs, url, "x", "B", dedup="d")
    assert a["MessageId"] != b["MessageId"]
    assert send(sqs, url, "x", "A", dedup="d")["MessageId"] == a["MessageId"]


def test_fifo_send_errors(sqs: Any) -> None:
    url = fifo_queue(sqs)

    def code(**kwargs: Any) -> str:
        with pytest.raises(ClientError) as info:
            sqs.send_message(QueueUrl=url, MessageBody="x", **kwargs)
        return error_code(info.value)[1]

    assert code(MessageDeduplicationId="d") == "MissingParameter"  # no group
    assert code(MessageGroupId="G") == "InvalidParameterValue"  # no dedup id, no CBD
    assert code(MessageGroupId="G", MessageDeduplicationId="d", DelaySeconds=5) == (
        "InvalidParameterValue"  # per-message delays are not for FIFO queues
    )
    assert code(MessageGroupId="bad group ☃", MessageDeduplicationId="d") == "InvalidParameterValue"
    standard = sqs.create_queue(QueueName=unique())["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=standard, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    redrive = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 1})
    with pytest.raises(ClientError) as info:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": redrive})
    assert "same type" in info.value.response["Error"]["Message"]


def test_send_message_batch_keeps_fifo_order(sqs: Any) -> None:
    url = fifo_queue(sqs)
    entries = [
        {
            "Id": f"e{i}",
            "MessageBody": f"m{i}",
            "MessageGroupId": "G",
            "MessageDeduplicationId": f"d{i}",
        }
        for i in range(5)
    ]
    result = sqs.send_message_batch(QueueUrl=url, Entries=entries)
    assert [e["Id"] for e in result["Successful"]] == [f"e{i}" for i in range(5)]
    sequence = [int(e["SequenceNumber"]) for e in result["Successful"]]
    assert sequence == sorted(sequence)
    seen = []
    for _ in range(3):  # runs of at most 2: m0 m1, m2 m3, m4
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=2)["Messages"]
        seen.append([m["Body"] for m in messages])
        for message in messages:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert seen == [["m0", "m1"], ["m2", "m3"], ["m4"]]


def test_on_a_fifo_queue_only_the_latest_receipt_handle_holds(sqs: Any) -> None:
    url = fifo_queue(sqs)
    send(sqs, url, "m1", "G")
    [first] = sqs.receive_message(QueueUrl=url, VisibilityTimeout=1)["Messages"]
    time.sleep(1.2)
    [second] = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2)["Messages"]
    with pytest.raises(ClientError) as info:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    # SQS's answer for the expired handle of a FIFO queue
    assert info.value.response["Error"] == {
        "Code": "InvalidParameterValue",
        "Message": f"Value {first['ReceiptHandle']} for parameter ReceiptHandle is invalid. "
        "Reason: The receipt handle has expired.",
        "QueryErrorCode": "InvalidParameterValueException",
        "Type": "Sender",
    }
    sqs.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])
    assert bodies(sqs, url) == []


def test_a_receive_retried_with_its_attempt_id_gets_the_same_messages_and_handles(
    sqs: Any,
) -> None:
    """ReceiveRequestAttemptId: a client whose answer was lost retries with the same id and
    gets the same messages and receipt handles, instead of a blocked group (AWS SDK for
    JavaScript v3 retries so); another id, or the same one after a delete, is a new receive."""
    url = fifo_queue(sqs)
    for body, group in [("a1", "A"), ("a2", "A"), ("b1", "B")]:
        send(sqs, url, body, group)

    def receive(attempt: str) -> list[tuple[str, str]]:
        messages = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=2, ReceiveRequestAttemptId=attempt
        ).get("Messages", [])
        return [(m["Body"], m["ReceiptHandle"]) for m in messages]

    first = receive("lost-answer-1")
    assert [b for b, _ in first] == ["a1", "a2"]
    assert receive("lost-answer-1") == first  # the retry: the same messages and handles
    assert [b for b, _ in receive("another-1")] == ["b1"]  # group A is still in flight
    assert receive("lost-answer-1") == first
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first[0][1])
    assert receive("lost-answer-1") == []  # changed since: a new receive, A still busy (a2)
    with pytest.raises(ClientError) as info:
        receive("bad id with spaces and é")
    assert error_code(info.value) == ("ClientError", "InvalidParameterValue")


def test_a_standard_queue_ignores_the_attempt_id(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=unique())["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="m1")
    sqs.send_message(QueueUrl=url, MessageBody="m2")
    got = [
        sqs.receive_message(QueueUrl=url, ReceiveRequestAttemptId="same")["Messages"][0]["Body"]
        for _ in range(2)
    ]
    assert sorted(got) == ["m1", "m2"]
