"""Message actions of the SQS API through boto3 against the real gateway on 127.0.0.1.

Send/receive/delete with attributes and their MD5s (checked by an independent
implementation), delays, long polls, visibility timeouts and receive counts, stale receipt
handles, batches with partial failures, dead-letter queues, sizes, evq's extensions, and the
same messages seen through the native API. Timing tests use 1-second timeouts.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.unit.gateway.sqs_support import (
    REGION,
    SqsServer,
    client_of,
    error_code,
    expected_md5,
    native,
    unique,
)

ATTRIBUTES = {
    "color": {"DataType": "String", "StringValue": "red ✓"},
    "count": {"DataType": "Number", "StringValue": "-12.5"},
    "blob": {"DataType": "Binary", "BinaryValue": b"\x00\xff\x10"},
    "custom": {"DataType": "String.json", "StringValue": '{"a": 1}'},
}


def new_queue(sqs: Any, **attributes: str) -> str:
    return sqs.create_queue(QueueName=unique(), Attributes=attributes)["QueueUrl"]  # type: ignore[no-any-return]


def fails(call: Any, **kwargs: Any) -> tuple[str, str]:
    with pytest.raises(ClientError) as info:
        call(**kwargs)
    return error_code(info.value)


def receive(sqs: Any, url: str, **kwargs: Any) -> list[dict[str, Any]]:
    return sqs.receive_message(QueueUrl=url, **kwargs).get("Messages", [])  # type: ignore[no-any-return]


def md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


# ---------------------------------------------------------------- basics


def test_send_receive_delete_with_attributes_and_their_md5s(sqs: Any) -> None:
    url = new_queue(sqs)
    body = "héllo\r\nworld 🌍"
    sent = sqs.send_message(QueueUrl=url, MessageBody=body, MessageAttributes=ATTRIBUTES)
    assert sent["MD5OfMessageBody"] == md5(body)
    assert sent["MD5OfMessageAttributes"] == expected_md5(ATTRIBUTES)
    [message] = receive(sqs, url, MessageAttributeNames=["All"], AttributeNames=["All"])
    assert message["MessageId"] == sent["MessageId"]
    assert message["Body"] == body
    assert message["MD5OfBody"] == md5(body)
    assert message["MessageAttributes"] == ATTRIBUTES
    assert message["MD5OfMessageAttributes"] == expected_md5(ATTRIBUTES)
    system = message["Attributes"]
    assert system["ApproximateReceiveCount"] == "1"
    now_ms = time.time() * 1000
    assert now_ms - 10_000 < int(system["SentTimestamp"]) <= now_ms
    assert int(system["SentTimestamp"]) <= int(system["ApproximateFirstReceiveTimestamp"])
    assert "MessageGroupId" not in system
    sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert receive(sqs, url) == []
    sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])  # idempotent


def test_receive_shows_only_the_attributes_asked_for(sqs: Any) -> None:
    url = new_queue(sqs)
    attributes = {
        "color.main": {"DataType": "String", "StringValue": "red"},
        "color.edge": {"DataType": "String", "StringValue": "blue"},
        "size": {"DataType": "Number", "StringValue": "3"},
    }
    sqs.send_message(QueueUrl=url, MessageBody="x", MessageAttributes=attributes)
    [plain] = receive(sqs, url, VisibilityTimeout=0)
    assert "MessageAttributes" not in plain
    assert "MD5OfMessageAttributes" not in plain
    assert "Attributes" not in plain
    [some] = receive(
        sqs,
        url,
        VisibilityTimeout=0,
        MessageAttributeNames=["color.*"],
        MessageSystemAttributeNames=["ApproximateReceiveCount"],
    )
    shown = {k: attributes[k] for k in ("color.main", "color.edge")}
    assert some["MessageAttributes"] == shown
    assert some["MD5OfMessageAttributes"] == expected_md5(shown)
    assert some["Attributes"] == {"ApproximateReceiveCount": "2"}
    [one] = receive(sqs, url, MessageAttributeNames=["size"])
    assert one["MessageAttributes"] == {"size": attributes["size"]}


def test_receive_hands_out_up_to_max_messages(sqs: Any) -> None:
    url = new_queue(sqs)
    sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": f"m{i}"} for i in range(10)]
    )
    first = receive(sqs, url, MaxNumberOfMessages=4)
    rest = receive(sqs, url, MaxNumberOfMessages=10)
    assert len(first) == 4
    assert sorted(m["Body"] for m in first + rest) == sorted(f"m{i}" for i in range(10))
    assert fails(sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=11)[1] == (
        "InvalidParameterValue"
    )


# ---------------------------------------------------------------- time


def test_delays_per_message_and_per_queue(sqs: Any) -> None:
    url = new_queue(sqs)
    sqs.send_message(QueueUrl=url, MessageBody="now")
    sqs.send_message(QueueUrl=url, MessageBody="soon", DelaySeconds=1)
    assert [m["Body"] for m in receive(sqs, url, MaxNumberOfMessages=10)] == ["now"]
    [later] = receive(sqs, url, WaitTimeSeconds=3)
    assert later["Body"] == "soon"
    delayed = new_queue(sqs, DelaySeconds="1")
    started = time.monotonic()
    sqs.send_message(QueueUrl=delayed, MessageBody="queue delay")
    assert receive(sqs, delayed) == []
    [message] = receive(sqs, delayed, WaitTimeSeconds=3)
    assert message["Body"] == "queue delay"
    assert time.monotonic() - started >= 0.9
    assert fails(sqs.send_message, QueueUrl=url, MessageBody="x", DelaySeconds=901)[1] == (
        "InvalidParameterValue"
    )


def test_a_long_poll_returns_as_soon_as_a_message_arrives(sqs: Any, server: SqsServer) -> None:
    url = new_queue(sqs)

    def send_later() -> None:
        time.sleep(0.5)
        with client_of(server) as other:
            other.send_message(QueueUrl=url, MessageBody="wake up")

    sender = threading.Thread(target=send_later)
    started = time.monotonic()
    sender.start()
    messages = receive(sqs, url, WaitTimeSeconds=15)
    took = time.monotonic() - started
    sender.join()
    assert [m["Body"] for m in messages] == ["wake up"]
    assert 0.4 < took < 5


def test_an_empty_long_poll_waits_its_time(sqs: Any) -> None:
    url = new_queue(sqs)
    started = time.monotonic()
    assert receive(sqs, url, WaitTimeSeconds=1) == []
    assert 0.9 < time.monotonic() - started < 5
    assert fails(sqs.receive_message, QueueUrl=url, WaitTimeSeconds=21)[1] == (
        "InvalidParameterValue"
    )


def test_the_queue_wait_time_is_the_default_long_poll(sqs: Any) -> None:
    url = new_queue(sqs, ReceiveMessageWaitTimeSeconds="1")
    started = time.monotonic()
    assert receive(sqs, url) == []
    assert time.monotonic() - started > 0.9
    started = time.monotonic()
    assert receive(sqs, url, WaitTimeSeconds=0) == []
    assert time.monotonic() - started < 0.9


def test_visibility_expiry_redelivers_and_counts_receives(sqs: Any) -> None:
    url = new_queue(sqs)
    sqs.send_message(QueueUrl=url, MessageBody="again")
    [first] = receive(sqs, url, VisibilityTimeout=1, AttributeNames=["ApproximateReceiveCount"])
    assert receive(sqs, url) == []  # in flight
    [second] = receive(sqs, url, WaitTimeSeconds=3, AttributeNames=["All"])
    assert second["MessageId"] == first["MessageId"]
    assert second["Attributes"]["ApproximateReceiveCount"] == "2"
    assert second["Attributes"]["ApproximateFirstReceiveTimestamp"] <= str(int(time.time() * 1000))
    assert second["ReceiptHandle"] != first["ReceiptHandle"]
    # As on SQS (standard queues), the first receive's handle still deletes the message,
    # although it was received again since; the second handle then finds nothing to do.
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    sqs.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (
        attrs["ApproximateNumberOfMessages"],
        attrs["ApproximateNumberOfMessagesNotVisible"],
    ) == (
        "0",
        "0",
    )


def test_change_message_visibility_extends_and_releases(sqs: Any) -> None:
    url = new_queue(sqs, VisibilityTimeout="1")
    sqs.send_message(QueueUrl=url, MessageBody="m")
    [message] = receive(sqs, url)
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=30
    )
    time.sleep(1.2)
    assert receive(sqs, url) == []  # extended past the queue's 1 s
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
    )
    [again] = receive(sqs, url, VisibilityTimeout=30)  # 0 = back in the queue now
    assert again["MessageId"] == message["MessageId"]
    # As on SQS, the handle of the earlier receive changes the visibility of the message
    # in flight under the later one.
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
    )
    [third] = receive(sqs, url, VisibilityTimeout=30)
    assert third["MessageId"] == message["MessageId"]
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=again["ReceiptHandle"], VisibilityTimeout=0
    )
    assert fails(
        sqs.change_message_visibility,
        QueueUrl=url,
        ReceiptHandle=again["ReceiptHandle"],
        VisibilityTimeout=10,
    ) == ("MessageNotInflight", "AWS.SimpleQueueService.MessageNotInflight")
    assert fails(
        sqs.change_message_visibility,
        QueueUrl=url,
        ReceiptHandle=again["ReceiptHandle"],
        VisibilityTimeout=43_201,
    )[1] == ("InvalidParameterValue")


# ---------------------------------------------------------------- batches


def test_send_message_batch_with_partial_failures(sqs: Any) -> None:
    url = new_queue(sqs)
    result = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "ok-1", "MessageBody": "one", "MessageAttributes": ATTRIBUTES},
            {
                "Id": "bad-attr",
                "MessageBody": "two",
                "MessageAttributes": {"AWS.x": ATTRIBUTES["color"]},
            },
            {"Id": "ok-2", "MessageBody": "three", "DelaySeconds": 0},
            {"Id": "bad-delay", "MessageBody": "four", "DelaySeconds": 1000},
            {"Id": "bad-chars", "MessageBody": "\x01"},
        ],
    )
    ok = {e["Id"]: e for e in result["Successful"]}
    assert set(ok) == {"ok-1", "ok-2"}
    assert ok["ok-1"]["MD5OfMessageBody"] == md5("one")
    assert ok["ok-1"]["MD5OfMessageAttributes"] == expected_md5(ATTRIBUTES)
    failed = {e["Id"]: e for e in result["Failed"]}
    assert set(failed) == {"bad-attr", "bad-delay", "bad-chars"}
    assert all(e["SenderFault"] for e in failed.values())
    assert failed["bad-attr"]["Code"] == "InvalidParameterValue"
    assert failed["bad-chars"]["Code"] == "InvalidMessageContents"
    bodies = sorted(m["Body"] for m in receive(sqs, url, MaxNumberOfMessages=10))
    assert bodies == ["one", "three"]


def test_batch_requests_are_checked_whole(sqs: Any) -> None:
    url = new_queue(sqs)
    eleven = [{"Id": str(i), "MessageBody": "x"} for i in range(11)]
    assert fails(sqs.send_message_batch, QueueUrl=url, Entries=eleven) == (
        "TooManyEntriesInBatchRequest",
        "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
    )
    twins = [{"Id": "a", "MessageBody": "x"}, {"Id": "a", "MessageBody": "y"}]
    assert fails(sqs.send_message_batch, QueueUrl=url, Entries=twins) == (
        "BatchEntryIdsNotDistinct",
        "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
    )
    assert fails(sqs.send_message_batch, QueueUrl=url, Entries=[]) == (
        "EmptyBatchRequest",
        "AWS.SimpleQueueService.EmptyBatchRequest",
    )
    bad_id = [{"Id": "no spaces", "MessageBody": "x"}]
    assert fails(sqs.send_message_batch, QueueUrl=url, Entries=bad_id) == (
        "InvalidBatchEntryId",
        "AWS.SimpleQueueService.InvalidBatchEntryId",
    )
    big = [{"Id": str(i), "MessageBody": "x" * 300_000} for i in range(4)]
    assert fails(sqs.send_message_batch, QueueUrl=url, Entries=big) == (
        "BatchRequestTooLong",
        "AWS.SimpleQueueService.BatchRequestTooLong",
    )
    assert receive(sqs, url) == []  # nothing of the refused batches went in


def test_delete_and_change_visibility_batches_with_partial_failures(sqs: Any) -> None:
    url = new_queue(sqs)
    sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": f"m{i}"} for i in range(4)]
    )
    messages = receive(sqs, url, MaxNumberOfMessages=10, VisibilityTimeout=30)
    assert len(messages) == 4
    handles = [m["ReceiptHandle"] for m in messages]
    changed = sqs.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "back", "ReceiptHandle": handles[0], "VisibilityTimeout": 0},
            {"Id": "longer", "ReceiptHandle": handles[1], "VisibilityTimeout": 60},
            {"Id": "garbage", "ReceiptHandle": "not-a-handle", "VisibilityTimeout": 5},
        ],
    )
    assert sorted(e["Id"] for e in changed["Successful"]) == ["back", "longer"]
    assert [(e["Id"], e["Code"]) for e in changed["Failed"]] == [
        ("garbage", "ReceiptHandleIsInvalid")
    ]
    deleted = sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "stale", "ReceiptHandle": handles[0]},  # released above
            {"Id": "fine", "ReceiptHandle": handles[2]},
            {"Id": "fine-too", "ReceiptHandle": handles[3]},
            {"Id": "garbage", "ReceiptHandle": "evq1.AAAA"},
        ],
    )
    # "stale": released above, yet its handle deletes it, as on SQS
    assert sorted(e["Id"] for e in deleted["Successful"]) == ["fine", "fine-too", "stale"]
    assert [(e["Id"], e["Code"]) for e in deleted["Failed"]] == [
        ("garbage", "ReceiptHandleIsInvalid")
    ]
    assert receive(sqs, url, MaxNumberOfMessages=10) == []


def test_garbage_and_foreign_receipt_handles_are_invalid(sqs: Any) -> None:
    url, other = new_queue(sqs), new_queue(sqs)
    sqs.send_message(QueueUrl=other, MessageBody="x")
    [message] = receive(sqs, other)
    invalid = ("ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid")
    for handle in ("garbage", "evq1.!!!!", message["ReceiptHandle"]):
        assert fails(sqs.delete_message, QueueUrl=url, ReceiptHandle=handle) == invalid


# ---------------------------------------------------------------- dead letters, sizes


def test_messages_go_to_the_dead_letter_queue_after_max_receives(sqs: Any) -> None:
    dlq = new_queue(sqs)
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    redrive = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2})
    url = new_queue(sqs, RedrivePolicy=redrive)
    source_arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    sqs.send_message(QueueUrl=url, MessageBody="poison", MessageAttributes=ATTRIBUTES)
    for count in ("1", "2"):
        [m] = receive(sqs, url, VisibilityTimeout=0, AttributeNames=["ApproximateReceiveCount"])
        assert m["Attributes"]["ApproximateReceiveCount"] == count
    [dead] = receive(
        sqs, dlq, WaitTimeSeconds=5, MessageAttributeNames=["All"], AttributeNames=["All"]
    )
    assert dead["Body"] == "poison"
    assert dead["Attributes"]["DeadLetterQueueSourceArn"] == source_arn
    assert {k: dead["MessageAttributes"][k] for k in ATTRIBUTES} == ATTRIBUTES
    assert dead["MD5OfMessageAttributes"] == expected_md5(dead["MessageAttributes"])
    assert receive(sqs, url) == []
    assert source_arn.startswith(f"arn:aws:sqs:{REGION}:")


def test_messages_over_the_limit_are_refused_and_evq_allows_more(sqs: Any) -> None:
    url = new_queue(sqs)
    mib = 1024 * 1024
    assert fails(sqs.send_message, QueueUrl=url, MessageBody="x" * (mib + 1))[1] == (
        "InvalidParameterValue"
    )
    with_attrs = {"a": {"DataType": "String", "StringValue": "y" * 100}}
    assert (
        fails(
            sqs.send_message,
            QueueUrl=url,
            MessageBody="x" * (mib - 50),
            MessageAttributes=with_attrs,
        )[1]
        == "InvalidParameterValue"
    )  # attributes count toward the size, as in SQS
    sqs.send_message(QueueUrl=url, MessageBody="x" * mib)
    small = new_queue(sqs, MaximumMessageSize="1024")
    assert fails(sqs.send_message, QueueUrl=small, MessageBody="x" * 1025)[1] == (
        "InvalidParameterValue"
    )
    big = new_queue(sqs, **{"evq.MaximumMessageSize": str(4 * mib)})
    body = "b" * (3 * mib)
    sent = sqs.send_message(QueueUrl=big, MessageBody=body)
    [message] = receive(sqs, big)
    assert message["Body"] == body
    assert message["MD5OfBody"] == sent["MD5OfMessageBody"]


def test_bad_message_input_is_refused(sqs: Any) -> None:
    url = new_queue(sqs)
    assert fails(sqs.send_message, QueueUrl=url, MessageBody="")[1] == "MissingParameter"
    assert fails(sqs.send_message, QueueUrl=url, MessageBody="\ufffe")[1] == (
        "InvalidMessageContents"
    )
    eleven = {f"a{i}": {"DataType": "String", "StringValue": "v"} for i in range(11)}
    assert fails(sqs.send_message, QueueUrl=url, MessageBody="x", MessageAttributes=eleven)[1] == (
        "InvalidParameterValue"
    )
    assert (
        fails(sqs.send_message, QueueUrl=url, MessageBody="x", MessageDeduplicationId="d")[1]
        == "InvalidParameterValue"
    )  # standard queues have no deduplication ids


# ---------------------------------------------------------------- evq extensions


def test_evq_delay_and_activation_time_go_past_sqs_limits(sqs: Any) -> None:
    url = new_queue(sqs)
    number = "Number"
    hour = {"evq.DelaySeconds": {"DataType": number, "StringValue": "3600"}}
    sent = sqs.send_message(QueueUrl=url, MessageBody="in an hour", MessageAttributes=hour)
    assert sent["MD5OfMessageAttributes"] == expected_md5(hour)  # of what was sent
    sqs.send_message(QueueUrl=url, MessageBody="normal")
    past = {"evq.ActivateAt": {"DataType": number, "StringValue": str(time.time() - 3600)}}
    sqs.send_message(QueueUrl=url, MessageBody="urgent", MessageAttributes=past)
    got = receive(sqs, url, MaxNumberOfMessages=10, MessageAttributeNames=["All"])
    assert [m["Body"] for m in got] == ["urgent", "normal"]  # an old activation time jumps ahead
    assert all("MessageAttributes" not in m for m in got)  # extensions are not stored
    delayed = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesDelayed"]
    )
    assert delayed["Attributes"]["ApproximateNumberOfMessagesDelayed"] == "1"
    both = {**hour, **past}
    assert fails(sqs.send_message, QueueUrl=url, MessageBody="x", MessageAttributes=both)[1] == (
        "InvalidParameterValue"
    )
    long = new_queue(sqs, **{"evq.DelaySeconds": "7200"})
    assert sqs.get_queue_attributes(QueueUrl=long, AttributeNames=["DelaySeconds"])[
        "Attributes"
    ] == {"DelaySeconds": "7200"}


def test_evq_idempotency_key_deduplicates_on_standard_queues(sqs: Any) -> None:
    url = new_queue(sqs)
    key = {"evq.IdempotencyKey": {"DataType": "String", "StringValue": "order-42"}}
    first = sqs.send_message(QueueUrl=url, MessageBody="charge", MessageAttributes=key)
    again = sqs.send_message(QueueUrl=url, MessageBody="charge", MessageAttributes=key)
    assert again["MessageId"] == first["MessageId"]
    assert len(receive(sqs, url, MaxNumberOfMessages=10)) == 1


# ---------------------------------------------------------------- both APIs


def test_a_message_sent_through_sqs_is_taken_natively(sqs: Any, server: SqsServer) -> None:
    name = unique()
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sent = sqs.send_message(QueueUrl=url, MessageBody="to native", MessageAttributes=ATTRIBUTES)
    [taken] = native(server, "POST", f"/v1/queues/{name}/take", {"max": 10})["messages"]
    assert taken["id"] == sent["MessageId"]
    assert taken["body"] == "to native"
    assert taken["attributes"]["color"] == "red ✓"  # String attributes are plain strings
    assert taken["attributes"]["count"] == {"DataType": "Number", "StringValue": "-12.5"}
    acked = native(
        server,
        "POST",
        f"/v1/queues/{name}/ack",
        {"items": [{"id": taken["id"], "lease": taken["lease"]}]},
    )
    assert acked["results"][0]["status"] == "ok"


def test_a_message_put_natively_is_received_through_sqs(sqs: Any, server: SqsServer) -> None:
    name = unique()
    native(server, "PUT", f"/v1/queues/{name}", {})
    doc = {"messages": [{"body": "from native", "attributes": {"kind": "native"}}]}
    [put] = native(server, "POST", f"/v1/queues/{name}/messages", doc)["results"]
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    [message] = receive(sqs, url, MessageAttributeNames=["All"])
    assert (message["MessageId"], message["Body"]) == (put["id"], "from native")
    kind = {"kind": {"DataType": "String", "StringValue": "native"}}
    assert message["MessageAttributes"] == kind
    assert message["MD5OfMessageAttributes"] == expected_md5(kind)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    stats = native(server, "GET", f"/v1/queues/{name}")["stats"]
    assert (stats["total"], stats["acked"]) == (0, 1)


def test_requests_for_missing_queues_say_so(sqs: Any, server: SqsServer) -> None:
    url = server.queue_url(unique("absent"))
    missing = ("QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue")
    assert fails(sqs.send_message, QueueUrl=url, MessageBody="x") == missing
    assert fails(sqs.receive_message, QueueUrl=url) == missing
    assert fails(sqs.receive_message, QueueUrl=url, WaitTimeSeconds=1) == missing
    assert fails(sqs.purge_queue, QueueUrl=url) == missing
    assert fails(sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["All"]) == missing
