"""Every SQS command on messages held in runs (issue 33) through a real ``evq serve`` and
boto3: batches with message attributes, due 2 s later, into a queue deep enough in delayed
messages that they spill, standard and FIFO, and wake as runs; receive, change of
visibility (one and a batch: a release now, a release with a backoff, an extension), delete
(one and a batch), the queue's counts and a purge each see or end exactly the messages they
name, a FIFO group's order holds throughout, and attributes are read back whole."""

from __future__ import annotations

import time
from typing import Any

import pytest

from actors.core.state import RUN_DEPTH
from actors.errors import MessageNotFound
from evq.client import Client, NewMessage
from tests.integration.conftest import Names, ServerFactory
from tests.integration.server import eventually, server_env
from tests.integration.test_spilled_attributes import spilled
from tests.integration.test_sqs_server import KEY, SECRET, client
from tests.unit.gateway.sqs_support import expected_md5

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

BACKOFF_S = 3  # a release with a backoff: due again this much later

SENT_ATTRS = {
    "kind": {"DataType": "String", "StringValue": "invoice"},
    "amount": {"DataType": "Number", "StringValue": "12.5"},
    "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xff"},
}


def receive(sqs: Any, url: str, n: int, visibility: int = 600) -> list[dict[str, Any]]:
    """Up to ``n`` messages (several receives of at most 10), with their attributes."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    while len(got) < n and time.monotonic() < deadline:
        reply = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=min(10, n - len(got)),
            MessageAttributeNames=["All"],
            AttributeNames=["All"],
            VisibilityTimeout=visibility,
            WaitTimeSeconds=1,
        )
        got += reply.get("Messages", [])
    return got


def whole(messages: list[dict[str, Any]]) -> bool:
    """Each message carries the attributes it was sent with, and their MD5."""
    return all(
        m["MessageAttributes"] == SENT_ATTRS
        and m["MD5OfMessageAttributes"] == expected_md5(SENT_ATTRS)
        for m in messages
    )


def delete(sqs: Any, url: str, messages: list[dict[str, Any]]) -> None:
    """DeleteMessageBatch of ``messages``, ten at a time; every one must succeed."""
    for k in range(0, len(messages), 10):
        part = messages[k : k + 10]
        entries = [{"Id": str(j), "ReceiptHandle": m["ReceiptHandle"]} for j, m in enumerate(part)]
        assert len(sqs.delete_message_batch(QueueUrl=url, Entries=entries)["Successful"]) == len(
            part
        )


def counts(sqs: Any, url: str) -> tuple[int, int, int]:
    """(visible, in flight, delayed) as GetQueueAttributes says."""
    a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return (
        int(a["ApproximateNumberOfMessages"]),
        int(a["ApproximateNumberOfMessagesNotVisible"]),
        int(a["ApproximateNumberOfMessagesDelayed"]),
    )


@pytest.mark.parametrize("fifo", [False, True], ids=["standard", "fifo"])
def test_every_sqs_command_on_spilled_messages_with_attributes(
    make_server: ServerFactory, names: Names, fifo: bool
) -> None:
    server = make_server("--shards", "1", env=server_env(EVQ_SQS_KEYS=f"{KEY}:{SECRET}"))
    sqs: Any = client(server, KEY, SECRET)
    name = names("sqsruns") + (".fifo" if fifo else "")
    # due 2 s after they are sent (a FIFO queue delays per queue): they count against the
    # delayed depth, so even batches of 10 are runs, and wake as runs
    attributes = (
        {"FifoQueue": "true", "ContentBasedDeduplication": "true", "DelaySeconds": "2"}
        if fifo
        else {}
    )
    url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    with Client(server.url, retries=0, timeout=20) as c:  # the depth: due in an hour
        for b in range(RUN_DEPTH // 1000):
            filler = [
                NewMessage(body=f"filler {b}-{i}", group="filler" if fifo else None, delay=3600)
                for i in range(1000)
            ]
            c.put(name, filler)
    base = spilled(server.url, name)
    assert base >= RUN_DEPTH - 1  # held in runs (a FIFO group's head is an object)

    sending = time.monotonic()
    for b in range(3):  # 30 messages (a FIFO queue's in one group), each batch one run
        entries = [
            {"Id": f"m{i}", "MessageBody": f"body {b}-{i}", "MessageAttributes": SENT_ATTRS}
            | ({"MessageGroupId": "g0"} if fifo else {"DelaySeconds": 2})
            for i in range(10)
        ]
        assert len(sqs.send_message_batch(QueueUrl=url, Entries=entries)["Successful"]) == 10
    # the batches are runs; a FIFO queue's new group holds its head as an object
    held = base + 30 - (1 if fifo else 0)
    assert spilled(server.url, name) == held
    if time.monotonic() - sending < 2:  # (a loaded host may take longer than the delay)
        assert counts(sqs, url)[0] < 30  # not all due yet
    eventually(lambda: counts(sqs, url) == (30, 0, RUN_DEPTH), timeout=30, what="due")
    assert spilled(server.url, name) == held  # woken as runs
    sent = [f"body {b}-{i}" for b in range(3) for i in range(10)]

    first = receive(sqs, url, 10)
    assert len(first) == 10
    assert whole(first)
    if fifo:  # the group's first ten, in order
        assert [m["Body"] for m in first] == sent[:10]
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in first} == {"1"}
    assert counts(sqs, url) == (20, 10, RUN_DEPTH)

    # released at once (a batch): handed out again, whole
    released = sqs.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[
            {"Id": str(k), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
            for k, m in enumerate(first)
        ],
    )
    assert len(released["Successful"]) == 10
    if fifo:  # the group's head again: the same ten, in order
        again = receive(sqs, url, 10)
        others: list[dict[str, Any]] = []
        assert [m["Body"] for m in again] == sent[:10]
    else:  # behind the others, due earlier
        everything = receive(sqs, url, 30)
        again = [m for m in everything if m["Body"] in {x["Body"] for x in first}]
        others = [m for m in everything if m not in again]
        assert sorted(m["Body"] for m in others) == sorted(set(sent) - {m["Body"] for m in again})
        assert {m["Attributes"]["ApproximateReceiveCount"] for m in others} == {"1"}
        assert whole(others)
    assert sorted(m["Body"] for m in again) == sorted(m["Body"] for m in first)
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in again} == {"2"}
    assert whole(again)

    # one extended, one deleted, the rest given back with a backoff (BACKOFF_S)
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=again[0]["ReceiptHandle"], VisibilityTimeout=600
    )
    sqs.delete_message(QueueUrl=url, ReceiptHandle=again[1]["ReceiptHandle"])
    # a receipt of the earlier receive: SQS takes it on a standard queue (for the message
    # in flight), refuses it on a FIFO queue
    stale = next(m for m in first if m["Body"] == again[0]["Body"])
    extend = {"QueueUrl": url, "ReceiptHandle": stale["ReceiptHandle"], "VisibilityTimeout": 600}
    if fifo:
        with pytest.raises(sqs.exceptions.ClientError, match="expired"):
            sqs.change_message_visibility(**extend)
    else:
        sqs.change_message_visibility(**extend)
    backoff = again[2:]
    done = sqs.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[
            {"Id": str(k), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": BACKOFF_S}
            for k, m in enumerate(backoff)
        ],
    )
    assert len(done["Successful"]) == 8
    backed_off = time.monotonic()
    gone = others  # deleted below (standard)
    if fifo:
        # the group waits while its head is in flight, backoff over or not
        eventually(lambda: counts(sqs, url)[0] == 8 + 20, timeout=30, what="the backoff over")
        reply = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        assert not reply.get("Messages")
        sqs.delete_message(QueueUrl=url, ReceiptHandle=again[0]["ReceiptHandle"])
        # then the rest of the group, in order: the backoff's 8 first, every one whole (each
        # batch deleted before the next receive: the group waits while any is in flight)
        late: list[dict[str, Any]] = []
        while len(late) < 28:
            got = receive(sqs, url, 10)
            assert got, f"the group stopped after {len(late)}"
            delete(sqs, url, got)
            late += got
        assert [m["Body"] for m in late] == sent[2:]
        counted = [m["Attributes"]["ApproximateReceiveCount"] for m in late]
        assert counted == ["3"] * 8 + ["1"] * 20
        left = 0  # the extended head was deleted
    else:
        if time.monotonic() - backed_off < BACKOFF_S:
            assert counts(sqs, url)[0] == 0  # the 8 wait out their backoff
        late = receive(sqs, url, 8)
        assert sorted(m["Body"] for m in late) == sorted(m["Body"] for m in backoff)
        assert {m["Attributes"]["ApproximateReceiveCount"] for m in late} == {"3"}
        left = 1  # the extended one
        delete(sqs, url, gone + late)
    assert whole(late)

    # deleted (in batches): gone for good; the extended one (standard) and the fillers stay
    with Client(server.url, retries=0, timeout=20) as c:
        stats = c.get_queue(name).stats
        assert stats is not None
        assert (stats.total, stats.reserved) == (RUN_DEPTH + left, left)
        if left:
            kept = c.get_message(name, again[0]["MessageId"])
            assert (kept.state, kept.body) == ("reserved", again[0]["Body"].encode())
        with pytest.raises(MessageNotFound):
            c.get_message(name, again[1]["MessageId"])

    sqs.purge_queue(QueueUrl=url)  # the runs and the messages alike
    eventually(lambda: counts(sqs, url) == (0, 0, 0), timeout=30, what="the purge")
    with Client(server.url, retries=0, timeout=20) as c:
        stats = c.get_queue(name).stats
        assert stats is not None
        assert stats.total == 0
    assert spilled(server.url, name) == 0
    sqs.close()
