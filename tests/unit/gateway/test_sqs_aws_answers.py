"""Errors as AWS answers them, down to codes and message texts, driven by boto3 (JSON
protocol) against the real gateway.

The expected answers are AWS's recorded ones (status, ``Error.Code``, ``Error.Message`` and,
in the JSON protocol, the ``QueryErrorCode`` botocore reads from ``__type``), for the same
calls; the order of the checks too (a batch's total size before its entries, a queue's
existence before a receipt handle).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.unit.gateway.sqs_support import INVALID, SqsServer, error, unique

MAX = 1_048_576
MISSING = ("MissingParameter", "MissingRequiredParameterException")


def new_queue(sqs: Any, *, fifo: bool = False, **attributes: str) -> str:
    if fifo:
        attributes["FifoQueue"] = "true"
    return str(sqs.create_queue(QueueName=unique(fifo=fifo), Attributes=attributes)["QueueUrl"])


# ---------------------------------------------------------------- queue URLs


def test_a_bare_queue_name_serves_as_its_queue_url(sqs: Any) -> None:
    url = new_queue(sqs, fifo=True)
    name = url.rsplit("/", 1)[1]
    too_late = error(
        sqs.send_message,
        QueueUrl=name,
        MessageBody="test",
        DelaySeconds=5,
        MessageGroupId="g",
        MessageDeduplicationId="d1",
    )
    assert too_late == (
        *INVALID,
        "Value 5 for parameter DelaySeconds is invalid. Reason: The request include parameter "
        "that is not valid for this queue type.",
    )
    sqs.send_message(QueueUrl=name, MessageBody="m", MessageGroupId="g", MessageDeduplicationId="d")
    assert sqs.receive_message(QueueUrl=name)["Messages"][0]["Body"] == "m"


@pytest.mark.parametrize(
    "url",
    [
        "http://whatever-incorrect-queue-address",
        "no-such-queue",
        "http://localhost/000000000000/no-such-queue",
        "http://localhost/999999999999/no-such-queue",
        "http://localhost/000000000000/a/b",
    ],
)
def test_a_queue_url_that_names_no_queue_is_queue_does_not_exist(sqs: Any, url: str) -> None:
    with pytest.raises(sqs.exceptions.QueueDoesNotExist) as info:
        sqs.get_queue_attributes(QueueUrl=url)
    assert info.value.response["Error"] == {
        "Code": "AWS.SimpleQueueService.NonExistentQueue",
        "Message": "The specified queue does not exist.",
        "QueryErrorCode": "QueueDoesNotExist",
        "Type": "Sender",
    }


def test_the_queue_is_found_before_the_receipt_handle_is_read(sqs: Any, server: SqsServer) -> None:
    unknown = server.queue_url("unknown")
    entries = [{"Id": "1", "ReceiptHandle": "unknown"}]
    calls: list[tuple[Any, dict[str, Any]]] = [
        (sqs.delete_message, {"ReceiptHandle": "unknown"}),
        (sqs.change_message_visibility, {"ReceiptHandle": "unknown", "VisibilityTimeout": 1}),
        (sqs.delete_message_batch, {"Entries": entries}),
        (
            sqs.change_message_visibility_batch,
            {"Entries": [{**entries[0], "VisibilityTimeout": 1}]},
        ),
    ]
    for call, kwargs in calls:
        code = error(call, QueueUrl=unknown, **kwargs)[0]
        assert code == "AWS.SimpleQueueService.NonExistentQueue", call


# ---------------------------------------------------------------- sends


def test_delay_seconds_0_on_a_fifo_queue_takes_the_queue_delay(sqs: Any) -> None:
    url = new_queue(sqs, fifo=True, ContentBasedDeduplication="true", DelaySeconds="1")
    sent = sqs.send_message(QueueUrl=url, MessageBody="m", MessageGroupId="1", DelaySeconds=0)
    assert sent["SequenceNumber"]
    assert "Messages" not in sqs.receive_message(QueueUrl=url)  # the queue's 1 s delay
    time.sleep(1.2)
    assert sqs.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "m"
    batch = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": f"id_{i}", "MessageBody": f"b{i}", "DelaySeconds": 0, "MessageGroupId": "2"}
            for i in (1, 2)
        ],
    )
    assert sorted(e["Id"] for e in batch["Successful"]) == ["id_1", "id_2"]


def test_a_batch_is_measured_whole_before_its_entries(sqs: Any) -> None:
    url = new_queue(sqs)
    attributes = {"k": {"DataType": "String", "StringValue": "x"}}  # 1 + 6 + 1 bytes
    entries = [
        {"Id": "1", "MessageBody": "a" * (MAX - 8), "MessageAttributes": attributes},
        {"Id": "2", "MessageBody": "a"},
    ]
    too_long = (
        "AWS.SimpleQueueService.BatchRequestTooLong",
        "BatchRequestTooLong",
        f"Batch requests cannot be longer than {MAX} bytes. You have sent {MAX + 1} bytes.",
    )
    assert error(sqs.send_message_batch, QueueUrl=url, Entries=entries) == too_long
    one = [{"Id": "id_1", "MessageBody": "b" * (MAX + 1)}]
    assert error(sqs.send_message_batch, QueueUrl=url, Entries=one) == too_long
    assert "Messages" not in sqs.receive_message(QueueUrl=url)


def test_an_entry_over_the_queue_limit_fails_alone_in_sqs_words(sqs: Any) -> None:
    url = new_queue(sqs, MaximumMessageSize="1024")
    result = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[{"Id": "ok", "MessageBody": "a" * 1024}, {"Id": "big", "MessageBody": "a" * 1025}],
    )
    assert [e["Id"] for e in result["Successful"]] == ["ok"]
    assert result["Failed"] == [
        {
            "Id": "big",
            "SenderFault": True,
            "Code": "InvalidParameterValue",
            "Message": "One or more parameters cannot be validated. Reason: Message must be "
            "shorter than 1024 bytes.",
        }
    ]
    assert error(sqs.send_message, QueueUrl=url, MessageBody="a" * 1025) == (
        *INVALID,
        "One or more parameters are invalid. Reason: Message must be shorter than 1024 bytes.",
    )


def test_a_fifo_batch_missing_a_group_or_a_deduplication_id_fails_whole(sqs: Any) -> None:
    url = new_queue(sqs, fifo=True)
    good = {"Id": "good", "MessageBody": "b", "MessageGroupId": "g", "MessageDeduplicationId": "1"}
    no_group = {"Id": "no_group", "MessageBody": "b", "MessageDeduplicationId": "2"}
    no_dedup = {"Id": "no_dedup", "MessageBody": "b", "MessageGroupId": "g"}
    assert error(sqs.send_message_batch, QueueUrl=url, Entries=[good, no_group]) == (
        *INVALID,
        "The request must contain the parameter MessageGroupId.",
    )
    assert error(sqs.send_message_batch, QueueUrl=url, Entries=[good, no_dedup]) == (
        *INVALID,
        "The queue should either have ContentBasedDeduplication enabled or "
        "MessageDeduplicationId provided explicitly",
    )
    no_group_either = {**no_group, "Id": "no_group_either"}
    assert error(sqs.send_message_batch, QueueUrl=url, Entries=[no_group, no_group_either]) == (
        *MISSING,  # no entry has a group: the request lacks the parameter
        "The request must contain the parameter MessageGroupId.",
    )
    assert "Messages" not in sqs.receive_message(QueueUrl=url)  # nothing was sent
    # A single send names the missing group otherwise.
    assert error(sqs.send_message, QueueUrl=url, MessageBody="b", MessageDeduplicationId="3") == (
        *MISSING,
        "The request must contain the parameter MessageGroupId.",
    )


@pytest.mark.parametrize("value", ["", "a" * 129, "group 123"])
def test_group_and_deduplication_ids_out_of_bounds_in_sqs_words(sqs: Any, value: str) -> None:
    standard, fifo = new_queue(sqs), new_queue(sqs, fifo=True)
    assert error(sqs.send_message, QueueUrl=standard, MessageBody="m", MessageGroupId=value) == (
        *INVALID,
        f"Value {value} for parameter MessageGroupId is invalid. Reason: MessageGroupId can "
        "only include alphanumeric and punctuation characters. 1 to 128 in length.",
    )
    sent = error(
        sqs.send_message,
        QueueUrl=fifo,
        MessageBody="m",
        MessageGroupId="g",
        MessageDeduplicationId=value,
    )
    assert sent == (
        *INVALID,
        f"Value {value} for parameter MessageDeduplicationId is invalid. Reason: "
        "MessageDeduplicationId can only include alphanumeric and punctuation characters. "
        "1 to 128 in length.",
    )


def test_a_deduplication_id_on_a_standard_queue_is_refused(sqs: Any) -> None:
    url = new_queue(sqs)
    sent = error(sqs.send_message, QueueUrl=url, MessageBody="m", MessageDeduplicationId="X")
    assert sent == (
        *INVALID,
        "Value X for parameter MessageDeduplicationId is invalid. Reason: The request include "
        "parameter that is not valid for this queue type.",
    )


def test_message_attribute_errors_in_sqs_words(sqs: Any) -> None:
    url = new_queue(sqs)

    def refused(attributes: dict[str, Any]) -> str:
        code, query_code, message = error(
            sqs.send_message, QueueUrl=url, MessageBody="m", MessageAttributes=attributes
        )
        assert (code, query_code) == INVALID
        return message

    name = refused({"öther_encodings": {"DataType": "String", "StringValue": "str"}})
    assert name == (
        "The message attribute name 'öther_encodings' is invalid. Attribute name can contain "
        "A-Z, a-z, 0-9, underscore (_), hyphen (-), and period (.) characters."
    )
    data_type = refused({"timestamp": {"DataType": "InvalidNumber", "StringValue": "1"}})
    assert data_type == (
        "The message attribute 'timestamp' has an invalid message attribute type, the set of "
        "supported type prefixes is Binary, Number, and String."
    )
    empty = refused({"ErrorDetails": {"DataType": "String", "StringValue": ""}})
    assert empty == (
        "Message (user) attribute 'ErrorDetails' must contain a non-empty value of type 'String'."
    )


def test_out_of_range_numbers_in_sqs_words(sqs: Any) -> None:
    url = new_queue(sqs)
    assert error(sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=11) == (
        *INVALID,
        "Value 11 for parameter MaxNumberOfMessages is invalid. Reason: Must be between 1 and "
        "10, if provided.",
    )
    for wait in (21, -1):
        assert error(sqs.receive_message, QueueUrl=url, WaitTimeSeconds=wait) == (
            *INVALID,
            f"Value {wait} for parameter WaitTimeSeconds is invalid. Reason: Must be >= 0 and "
            "<= 20, if provided.",
        )
    result = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "ok", "MessageBody": "m", "DelaySeconds": 900},
            {"Id": "too_late", "MessageBody": "m", "DelaySeconds": 901},
        ],
    )
    assert [e["Id"] for e in result["Successful"]] == ["ok"]
    assert result["Failed"] == [
        {
            "Id": "too_late",
            "SenderFault": True,
            "Code": "InvalidParameterValue",
            "Message": "Value 901 for parameter DelaySeconds is invalid. Reason: DelaySeconds "
            "must be >= 0 and <= 900.",
        }
    ]


# ---------------------------------------------------------------- receipt handles


def test_receipt_handle_errors_in_sqs_words(sqs: Any) -> None:
    url = new_queue(sqs)
    invalid = ("ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid")
    assert error(sqs.delete_message, QueueUrl=url, ReceiptHandle="not-existing") == (
        *invalid,
        "The input receipt handle is invalid.",
    )
    changed = error(
        sqs.change_message_visibility,
        QueueUrl=url,
        ReceiptHandle="unknown-stuff",
        VisibilityTimeout=432,
    )
    assert changed == (*invalid, "The input receipt handle is invalid.")
    sqs.send_message(QueueUrl=url, MessageBody="m")
    [message] = sqs.receive_message(QueueUrl=url)["Messages"]
    entries = [
        {"Id": "real", "ReceiptHandle": message["ReceiptHandle"]},
        {"Id": "fake", "ReceiptHandle": "fake-receipt-handle-1"},
    ]
    result = sqs.delete_message_batch(QueueUrl=url, Entries=entries)
    assert result["Successful"] == [{"Id": "real"}]
    assert result["Failed"] == [
        {
            "Id": "fake",
            "SenderFault": True,
            "Code": "ReceiptHandleIsInvalid",
            "Message": 'The input receipt handle "fake-receipt-handle-1" is not a valid receipt '
            "handle.",
        }
    ]


def test_changing_the_visibility_of_a_deleted_message_says_it_is_not_available(sqs: Any) -> None:
    url = new_queue(sqs, fifo=True)
    sqs.send_message(QueueUrl=url, MessageBody="m", MessageGroupId="g", MessageDeduplicationId="d")
    [message] = sqs.receive_message(QueueUrl=url)["Messages"]
    handle = message["ReceiptHandle"]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)
    assert error(
        sqs.change_message_visibility, QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=5
    ) == (
        *INVALID,
        f"Value {handle} for parameter ReceiptHandle is invalid. Reason: Message does not "
        "exist or is not available for visibility timeout change.",
    )


# ---------------------------------------------------------------- receives


def test_message_attribute_names_select_by_name_and_prefix(sqs: Any) -> None:
    url = new_queue(sqs, VisibilityTimeout="0")
    attributes = {
        "Help.Me": {"DataType": "String", "StringValue": "Me"},
        "Hello": {"DataType": "String", "StringValue": "There"},
        "General": {"DataType": "String", "StringValue": "Kenobi"},
    }
    sqs.send_message(QueueUrl=url, MessageBody="msg", MessageAttributes=attributes)

    def shown(names: list[str]) -> list[str]:
        [message] = sqs.receive_message(QueueUrl=url, MessageAttributeNames=names)["Messages"]
        return sorted(message.get("MessageAttributes", {}))

    everything = ["General", "Hello", "Help.Me"]
    assert shown([]) == []
    for names in (["All"], ["*"], [".*"]):
        assert shown(names) == everything, names
    assert shown(["Foo", "Help"]) == []
    assert shown(["Hello", "General"]) == ["General", "Hello"]
    assert shown(["Hel.*"]) == ["Hello", "Help.Me"]  # the prefix without its period
    assert shown(["Help.*"]) == ["Help.Me"]
    assert shown(["AWS."]) == []
    assert shown(["..foo"]) == []
