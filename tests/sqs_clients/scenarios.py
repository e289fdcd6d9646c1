"""SQS scenarios as users run them, written once for every boto3 there is.

Each scenario takes a boto3 SQS client and a name prefix of its own, makes the calls a user
would, and returns what it saw as a JSON-able dict (errors as ``{"error": code, "message":
…}``), so one test can check the same observations made through current boto3 (the JSON
protocol, in the test's own process) and through boto3/botocore 1.34.50 (the query
protocol), which runs this file as a script in ``.venv-sqs-legacy``:

    python scenarios.py ENDPOINT KEY SECRET REGION SCENARIO PREFIX

prints ``{"botocore": …, "protocol": …, **observations}``. Nothing here imports evq: the
scenarios see only what an SQS client sees.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import boto3
import botocore
from botocore.config import Config
from botocore.exceptions import ClientError

Sqs = Any
Observations = dict[str, Any]


def client(endpoint: str, key: str, secret: str, region: str) -> Sqs:
    """A boto3 SQS client that shows errors as they are (no retries)."""
    return boto3.session.Session().client(
        "sqs",
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1, "mode": "standard"}, read_timeout=60),
    )


def clean(reply: dict[str, Any]) -> dict[str, Any]:
    """A reply without its ResponseMetadata."""
    return {k: v for k, v in reply.items() if k != "ResponseMetadata"}


def error_of(call: Callable[..., Any], **kwargs: Any) -> dict[str, Any]:
    """The error a call fails with: code, message and HTTP status (or what it answered)."""
    try:
        return {"answered": clean(call(**kwargs))}
    except ClientError as exc:
        error = exc.response["Error"]
        return {
            "error": error.get("Code"),
            "message": error.get("Message"),
            "status": exc.response["ResponseMetadata"]["HTTPStatusCode"],
        }


def arn_of(sqs: Sqs, url: str) -> str:
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
    return str(attrs["Attributes"]["QueueArn"])


def counts(sqs: Sqs, url: str) -> list[int]:
    """ApproximateNumberOfMessages, …NotVisible, …Delayed."""
    names = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
    return [int(attrs[n]) for n in names]


def receive(sqs: Sqs, url: str, **kwargs: Any) -> list[dict[str, Any]]:
    kwargs.setdefault("MaxNumberOfMessages", 10)
    return list(sqs.receive_message(QueueUrl=url, **kwargs).get("Messages", []))


def wait_for(sqs: Sqs, url: str, n: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Receive until ``n`` messages came (long polls), all kept in flight."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += receive(
            sqs,
            url,
            WaitTimeSeconds=1,
            VisibilityTimeout=60,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
    return got


# ------------------------------------------------------------------ scenarios


def empties(sqs: Sqs, prefix: str) -> Observations:
    """Every action's empty case (the query protocol's Result element must be there)."""
    url = sqs.create_queue(QueueName=prefix)["QueueUrl"]
    out: Observations = {}
    out["receive_empty"] = clean(sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10))
    out["list_queues_no_match"] = clean(sqs.list_queues(QueueNamePrefix=f"{prefix}-none"))
    out["list_queue_tags_none"] = clean(sqs.list_queue_tags(QueueUrl=url))
    out["dead_letter_sources_none"] = clean(sqs.list_dead_letter_source_queues(QueueUrl=url))
    out["get_queue_attributes_none"] = clean(sqs.get_queue_attributes(QueueUrl=url))
    out["move_tasks_none"] = error_of(sqs.list_message_move_tasks, SourceArn=arn_of(sqs, url))
    out["send"] = sorted(clean(sqs.send_message(QueueUrl=url, MessageBody="hello")))
    got = receive(sqs, url, WaitTimeSeconds=1)
    out["receive_one"] = [m["Body"] for m in got]
    out["delete"] = clean(sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"]))
    out["receive_after_delete"] = clean(sqs.receive_message(QueueUrl=url))
    out["purge"] = clean(sqs.purge_queue(QueueUrl=url))
    out["delete_queue"] = clean(sqs.delete_queue(QueueUrl=url))
    return out


def old_handles(sqs: Sqs, prefix: str) -> Observations:
    """The receipt handle of an earlier receive, after the message's visibility timeout ran
    out and it was received again: on a standard queue (one message, then a batch) and on a
    FIFO queue. The three are received first, so that one wait serves them all."""
    one_s = {"VisibilityTimeout": "1"}
    url = sqs.create_queue(QueueName=prefix, Attributes=one_s)["QueueUrl"]
    batch = sqs.create_queue(QueueName=f"{prefix}-batch", Attributes=one_s)["QueueUrl"]
    fifo = sqs.create_queue(
        QueueName=f"{prefix}.fifo",
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true", **one_s},
    )["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="one")
    entries = [{"Id": f"e{i}", "MessageBody": f"b{i}"} for i in range(3)]
    sqs.send_message_batch(QueueUrl=batch, Entries=entries)
    sqs.send_message(QueueUrl=fifo, MessageBody="f", MessageGroupId="g")
    [first], firsts, [old] = receive(sqs, url), receive(sqs, batch), receive(sqs, fifo)
    time.sleep(1.3)
    [second] = receive(sqs, url, VisibilityTimeout=60)
    seconds = receive(sqs, batch, VisibilityTimeout=60)
    [new] = receive(sqs, fifo, VisibilityTimeout=60)
    out: Observations = {
        "same_message": first["MessageId"] == second["MessageId"],
        "handles_differ": first["ReceiptHandle"] != second["ReceiptHandle"],
    }
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0
    )
    out["visible_again_after_old_handle"] = [
        m["Body"] for m in receive(sqs, url, VisibilityTimeout=60)
    ]
    out["delete_with_old_handle"] = clean(
        sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    )
    out["counts_after_delete"] = counts(sqs, url)
    out["batch_received_twice"] = sorted(m["Body"] for m in seconds)
    changed = sqs.change_message_visibility_batch(
        QueueUrl=batch,
        Entries=[
            {"Id": f"c{i}", "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 120}
            for i, m in enumerate(firsts)
        ],
    )
    out["batch_change_with_old_handles"] = sorted(e["Id"] for e in changed["Successful"])
    deleted = sqs.delete_message_batch(
        QueueUrl=batch,
        Entries=[
            {"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(firsts)
        ],
    )
    out["batch_delete_with_old_handles"] = sorted(e["Id"] for e in deleted["Successful"])
    out["counts_after_batch_delete"] = counts(sqs, batch)
    out["fifo_change_with_old_handle"] = error_of(
        sqs.change_message_visibility,
        QueueUrl=fifo,
        ReceiptHandle=old["ReceiptHandle"],
        VisibilityTimeout=0,
    )
    out["fifo_delete_with_old_handle"] = error_of(
        sqs.delete_message, QueueUrl=fifo, ReceiptHandle=old["ReceiptHandle"]
    )
    out["fifo_delete_with_new_handle"] = clean(
        sqs.delete_message(QueueUrl=fifo, ReceiptHandle=new["ReceiptHandle"])
    )
    return out


def purge_twice(sqs: Sqs, prefix: str) -> Observations:
    url = sqs.create_queue(QueueName=prefix)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="x")
    return {
        "first": clean(sqs.purge_queue(QueueUrl=url)),
        "second": error_of(sqs.purge_queue, QueueUrl=url),
        "counts": counts(sqs, url),
    }


def dead_letter(sqs: Sqs, prefix: str) -> Observations:
    """A message moved to the dead-letter queue keeps its id, body, attributes and time."""
    dlq = sqs.create_queue(QueueName=f"{prefix}-dlq")["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": arn_of(sqs, dlq), "maxReceiveCount": 1})
    url = sqs.create_queue(
        QueueName=prefix, Attributes={"RedrivePolicy": policy, "VisibilityTimeout": "1"}
    )["QueueUrl"]
    attributes = {
        "colour": {"DataType": "String", "StringValue": "blue"},
        "size": {"DataType": "Number", "StringValue": "42"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01"},
    }
    sent = sqs.send_message(QueueUrl=url, MessageBody="to the dlq", MessageAttributes=attributes)
    [first] = receive(sqs, url, AttributeNames=["All"], MessageAttributeNames=["All"])
    time.sleep(1.3)
    [dead] = wait_for(sqs, dlq, 1)
    return {
        "same_id": dead["MessageId"] == sent["MessageId"],
        "same_body": dead["Body"] == first["Body"],
        "same_attributes": dead.get("MessageAttributes") == first.get("MessageAttributes"),
        "same_md5": dead.get("MD5OfMessageAttributes") == sent.get("MD5OfMessageAttributes"),
        "same_sent_timestamp": dead["Attributes"]["SentTimestamp"]
        == first["Attributes"]["SentTimestamp"],
        "source_arn": dead["Attributes"].get("DeadLetterQueueSourceArn") == arn_of(sqs, url),
        "receive_count": dead["Attributes"]["ApproximateReceiveCount"],
    }


def fifo_runs(sqs: Sqs, prefix: str) -> Observations:
    """A FIFO receive hands out a run of one group, in order; the group stays locked."""
    url = sqs.create_queue(
        QueueName=f"{prefix}.fifo",
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"},
    )["QueueUrl"]
    for body, group in [("a1", "A"), ("a2", "A"), ("b1", "B"), ("a3", "A"), ("b2", "B")]:
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group)
    first = receive(sqs, url, MaxNumberOfMessages=2)
    rest = receive(sqs, url)
    locked = receive(sqs, url)
    handles = {m["Body"]: m["ReceiptHandle"] for m in first + rest}
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handles["a2"])
    still_locked = receive(sqs, url)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handles["a1"])
    after = receive(sqs, url)
    return {
        "first": [m["Body"] for m in first],
        "rest": [m["Body"] for m in rest],
        "locked": [m["Body"] for m in locked],
        "still_locked": [m["Body"] for m in still_locked],
        "after": [m["Body"] for m in after],
    }


def errors(sqs: Sqs, prefix: str) -> Observations:
    """Error codes and messages as AWS words them."""
    url = sqs.create_queue(QueueName=prefix)["QueueUrl"]
    batch = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "fine", "MessageBody": "x"},
            {"Id": "late", "MessageBody": "y", "DelaySeconds": 901},
        ],
    )
    return {
        "empty_batch": error_of(sqs.send_message_batch, QueueUrl=url, Entries=[]),
        "empty_delete_batch": error_of(sqs.delete_message_batch, QueueUrl=url, Entries=[]),
        "batch_successful": [e["Id"] for e in batch.get("Successful", [])],
        "batch_failed": [(e["Id"], e["Code"], e["SenderFault"]) for e in batch.get("Failed", [])],
        "no_queue": error_of(sqs.get_queue_url, QueueName=f"{prefix}-missing"),
        "bad_handle": error_of(sqs.delete_message, QueueUrl=url, ReceiptHandle="garbage"),
    }


def move_task(sqs: Sqs, prefix: str) -> Observations:
    """Dead letters redriven back to where they came from."""
    dlq = sqs.create_queue(QueueName=f"{prefix}-dlq")["QueueUrl"]
    dlq_arn = arn_of(sqs, dlq)
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1})
    url = sqs.create_queue(
        QueueName=prefix, Attributes={"RedrivePolicy": policy, "VisibilityTimeout": "1"}
    )["QueueUrl"]
    sent = [sqs.send_message(QueueUrl=url, MessageBody=f"m{i}")["MessageId"] for i in range(3)]
    receive(sqs, url)
    time.sleep(1.3)
    moved = wait_for(sqs, dlq, 3)
    for m in moved:  # make them visible again in the dead-letter queue
        sqs.change_message_visibility(
            QueueUrl=dlq, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
        )
    out: Observations = {}
    out["not_a_dlq"] = error_of(sqs.start_message_move_task, SourceArn=arn_of(sqs, url))
    out["bad_handle"] = error_of(sqs.cancel_message_move_task, TaskHandle="foobared")
    handle = sqs.start_message_move_task(SourceArn=dlq_arn)["TaskHandle"]
    out["handle_is_text"] = isinstance(handle, str) and len(handle) > 0
    task = settled_task(sqs, dlq_arn)
    out["task"] = {k: task.get(k) for k in ("Status", "ApproximateNumberOfMessagesMoved")}
    out["task_keys"] = sorted(task)
    back = wait_for(sqs, url, 3)
    out["back_ids_match"] = sorted(m["MessageId"] for m in back) == sorted(sent)
    out["dlq_counts"] = counts(sqs, dlq)
    out["cancelled"] = cancelled_move(sqs, dlq, url)
    return out


def cancelled_move(sqs: Sqs, dlq: str, url: str) -> Observations:
    """A slow task to an explicit destination, cancelled while it runs: every message is
    either moved or still in the dead-letter queue."""
    entries = [{"Id": f"x{i}", "MessageBody": f"x{i}"} for i in range(5)]
    sqs.send_message_batch(QueueUrl=dlq, Entries=entries)  # straight in: no source
    handle = sqs.start_message_move_task(
        SourceArn=arn_of(sqs, dlq), DestinationArn=arn_of(sqs, url), MaxNumberOfMessagesPerSecond=1
    )["TaskHandle"]
    answer = clean(sqs.cancel_message_move_task(TaskHandle=handle))
    task = settled_task(sqs, arn_of(sqs, dlq))
    return {
        "answer_keys": sorted(answer),
        "moved_at_cancel_at_most_final": answer["ApproximateNumberOfMessagesMoved"]
        <= task["ApproximateNumberOfMessagesMoved"],
        "status": task["Status"],
        "handle_listed": "TaskHandle" in task,
        "again": error_of(sqs.cancel_message_move_task, TaskHandle=handle).get("error"),
        "moved_plus_left": task["ApproximateNumberOfMessagesMoved"] + counts(sqs, dlq)[0],
        "moved_arrived": counts(sqs, url)[0] == task["ApproximateNumberOfMessagesMoved"],
    }


def settled_task(sqs: Sqs, source_arn: str, timeout: float = 30.0) -> dict[str, Any]:
    """The newest move task of ``source_arn`` once it stopped running (or at the deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        [task] = sqs.list_message_move_tasks(SourceArn=source_arn)["Results"]
        if task["Status"] not in ("RUNNING", "CANCELLING") or time.monotonic() > deadline:
            return dict(task)
        time.sleep(0.2)


def permissions(sqs: Sqs, prefix: str) -> Observations:
    url = sqs.create_queue(QueueName=prefix)["QueueUrl"]
    sqs.add_permission(
        QueueUrl=url, Label="senders", AWSAccountIds=["111122223333"], Actions=["SendMessage"]
    )
    policy = json.loads(
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])["Attributes"]["Policy"]
    )
    out: Observations = {
        "statement_ids": [s["Sid"] for s in policy["Statement"]],
        "actions": policy["Statement"][0]["Action"],
        "same_label_again": error_of(
            sqs.add_permission,
            QueueUrl=url,
            Label="senders",
            AWSAccountIds=["111122223333"],
            Actions=["SendMessage"],
        )["error"],
    }
    sqs.remove_permission(QueueUrl=url, Label="senders")
    after = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])
    out["policy_after_remove"] = after.get("Attributes", {}).get("Policy")
    out["remove_unknown"] = error_of(sqs.remove_permission, QueueUrl=url, Label="nope")["error"]
    sqs.add_permission(
        QueueUrl=url, Label="again", AWSAccountIds=["111122223333"], Actions=["ReceiveMessage"]
    )
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": ""})
    cleared = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])
    out["policy_after_empty"] = cleared.get("Attributes", {}).get("Policy")
    return out


def paging(sqs: Sqs, prefix: str) -> Observations:
    dlq = sqs.create_queue(QueueName=f"{prefix}-dlq")["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": arn_of(sqs, dlq), "maxReceiveCount": 3})
    for i in range(3):
        sqs.create_queue(QueueName=f"{prefix}-src{i}", Attributes={"RedrivePolicy": policy})
    page1 = sqs.list_dead_letter_source_queues(QueueUrl=dlq, MaxResults=2)
    page2 = sqs.list_dead_letter_source_queues(
        QueueUrl=dlq, MaxResults=2, NextToken=page1["NextToken"]
    )
    lists = sqs.list_queues(QueueNamePrefix=f"{prefix}-src", MaxResults=2)
    lists2 = sqs.list_queues(
        QueueNamePrefix=f"{prefix}-src", MaxResults=2, NextToken=lists["NextToken"]
    )

    def names(urls: list[str]) -> list[str]:
        return [u.rsplit("/", 1)[1] for u in urls]

    return {
        "sources_page1": names(page1["queueUrls"]),
        "sources_page2": names(page2["queueUrls"]),
        "sources_page2_token": "NextToken" in page2,
        "list_page1": names(lists["QueueUrls"]),
        "list_page2": names(lists2["QueueUrls"]),
    }


def counters(sqs: Sqs, prefix: str) -> Observations:
    """The approximate counts, settled after each kind of change."""
    url = sqs.create_queue(QueueName=prefix)["QueueUrl"]
    out: Observations = {"empty": counts(sqs, url)}
    entries = [{"Id": f"e{i}", "MessageBody": f"m{i}"} for i in range(10)]
    sqs.send_message_batch(QueueUrl=url, Entries=entries)
    sqs.send_message_batch(
        QueueUrl=url,
        Entries=[{"Id": f"d{i}", "MessageBody": "later", "DelaySeconds": 600} for i in range(3)],
    )
    out["after_sends"] = counts(sqs, url)
    taken = receive(sqs, url, MaxNumberOfMessages=4, VisibilityTimeout=60)
    out["after_receive"] = counts(sqs, url)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=taken[0]["ReceiptHandle"])
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=taken[1]["ReceiptHandle"], VisibilityTimeout=0
    )
    out["after_delete_and_release"] = counts(sqs, url)
    return out


def read_only(sqs: Sqs, prefix: str) -> Observations:
    """What a caller that may only read queue ``prefix`` (made by someone else) gets."""
    url = sqs.get_queue_url(QueueName=prefix)["QueueUrl"]
    return {
        "attributes_read": arn_of(sqs, url).endswith(f":{prefix}"),
        "listed": url in sqs.list_queues(QueueNamePrefix=prefix).get("QueueUrls", []),
        "send": error_of(sqs.send_message, QueueUrl=url, MessageBody="x"),
        "receive": error_of(sqs.receive_message, QueueUrl=url).get("error"),
        "purge": error_of(sqs.purge_queue, QueueUrl=url).get("error"),
    }


SCENARIOS: dict[str, Callable[[Sqs, str], Observations]] = {
    f.__name__: f
    for f in (
        empties,
        old_handles,
        purge_twice,
        dead_letter,
        fifo_runs,
        errors,
        move_task,
        permissions,
        paging,
        counters,
        read_only,
    )
}


def main() -> None:
    endpoint, key, secret, region, scenario, prefix = sys.argv[1:7]
    sqs = client(endpoint, key, secret, region)
    out = {
        "botocore": botocore.__version__,
        "protocol": sqs.meta.service_model.protocol,
        **SCENARIOS[scenario](sqs, prefix),
    }
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
