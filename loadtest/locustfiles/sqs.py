"""SQS users: producers and consumers speaking AWS SQS to evq through boto3.

The same mix as the native fleet (:mod:`mix`) within SQS's rules: at most 10 messages and
256 KiB per send, ``DelaySeconds`` up to 900, string message attributes. Consumers
long-poll ``ReceiveMessage`` (``WaitTimeSeconds`` 20 mostly), work, then delete the batch;
a few messages are made visible again after a few seconds (``ChangeMessageVisibility``) or
left to time out. Queues are ``sqs-<name>`` so they do not mix with the native fleet's.

A boto3 client is heavy (CPU to build, a few MiB each): this file is for fleets of hundreds,
not thousands, per machine::

    locust -f loadtest/locustfiles/sqs.py --headless -u 100 -r 10 -t 60s \\
        --host http://127.0.0.1:8700

Credentials come from ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (any value works
when the server has no ``sqs_keys``), the region from ``AWS_REGION`` (us-east-1).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from typing import Any

import boto3
import fleet_counters
import gevent
import gevent.lock
import mix
from botocore.config import Config
from locust import User, between, constant, task

SQS_BODY_LIMIT = 256 * 1024
SQS_MAX_DELAY_S = 900
QUEUES = [f"sqs-{q}" for q in mix.QUEUES]
_urls: dict[str, str] = {}  # queue → URL, per process
_creating = gevent.lock.Semaphore()


class SqsUser(User):
    """A user with its own boto3 SQS client; every call is timed into Locust's statistics."""

    abstract = True

    def on_start(self) -> None:
        """Build the client; create the queues once per process."""
        self.rng: random.Random = mix.user_random()
        self.sqs = boto3.client(
            "sqs",
            endpoint_url=self.host,
            region_name=os.environ.get("AWS_REGION", "us-east-1"),
            aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "evq"),
            aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "evq"),
            config=Config(
                retries={"max_attempts": 1, "mode": "standard"},  # Locust counts failures
                connect_timeout=10,
                read_timeout=60,
                max_pool_connections=1,
            ),
        )
        with _creating:
            for queue in QUEUES:
                if queue not in _urls:
                    reply = self.call("CreateQueue", self.sqs.create_queue, QueueName=queue)
                    if reply:
                        _urls[queue] = reply["QueueUrl"]

    def on_stop(self) -> None:
        """Close the client's connections."""
        self.sqs.close()

    def call(self, name: str, method: Callable[..., Any], **params: Any) -> Any:
        """Call ``method`` and report it to Locust as request ``name``; None on failure."""
        start = time.perf_counter()
        reply, error = None, None
        try:
            reply = method(**params)
        except Exception as exc:  # every failure is a failed request in the statistics
            error = exc
        self.environment.events.request.fire(
            request_type="SQS",
            name=name,
            response_time=(time.perf_counter() - start) * 1000,
            response_length=0,
            exception=error,
            context={},
        )
        return reply

    def queue_url(self) -> str | None:
        """A queue's URL (hot queues more often), or None when it could not be created."""
        return _urls.get(f"sqs-{mix.pick_queue(self.rng)}")


def _entry(index: int, message: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {"Id": str(index), "MessageBody": message["body"]}
    if "delay" in message:
        entry["DelaySeconds"] = min(SQS_MAX_DELAY_S, int(message["delay"]))
    attributes = message.get("attributes") or {}
    if attributes:
        entry["MessageAttributes"] = {
            k: {"DataType": "String", "StringValue": v} for k, v in attributes.items()
        }
    return entry


class SqsProducerBase(SqsUser):
    """Sends one message, or a batch of up to 10."""

    abstract = True
    wait_time = between(1, 10)

    @task
    def send(self) -> None:
        """SendMessage or SendMessageBatch."""
        url = self.queue_url()
        if url is None:
            return
        messages = mix.new_messages(self.rng, limit=10, body_limit=SQS_BODY_LIMIT)
        entries = [_entry(i, m) for i, m in enumerate(messages)]
        if len(entries) == 1:
            entry = entries[0]
            del entry["Id"]
            reply = self.call("SendMessage", self.sqs.send_message, QueueUrl=url, **entry)
            sent = 1 if reply else 0
        else:
            reply = self.call(
                "SendMessageBatch", self.sqs.send_message_batch, QueueUrl=url, Entries=entries
            )
            sent = len((reply or {}).get("Successful", []))
        fleet_counters.count(put=sent, bytes_put=sum(len(m["body"]) for m in messages[:sent]))


class SqsConsumerBase(SqsUser):
    """Receives (long poll), works, deletes."""

    abstract = True
    wait_time = constant(0)
    work_mean_s = 0.2

    @task
    def receive(self) -> None:
        """ReceiveMessage, the work, DeleteMessageBatch (and some visibility changes)."""
        url = self.queue_url()
        if url is None:
            return
        wait = 20 if self.rng.random() < 0.8 else self.rng.choice([0, 1, 5])
        reply = self.call(
            f"ReceiveMessage [wait {wait}]",
            self.sqs.receive_message,
            QueueUrl=url,
            MaxNumberOfMessages=self.rng.choice([1, 10, 10, 10]),
            WaitTimeSeconds=wait,
            VisibilityTimeout=30,
            MessageAttributeNames=["All"],
        )
        messages = (reply or {}).get("Messages", [])
        if not messages:
            return
        fleet_counters.count(taken=len(messages), bytes_taken=sum(len(m["Body"]) for m in messages))
        gevent.sleep(self.rng.expovariate(1 / self.work_mean_s))
        done = []
        for m in messages:
            roll = self.rng.random()
            if roll < 0.95:
                done.append({"Id": m["MessageId"], "ReceiptHandle": m["ReceiptHandle"]})
            elif roll < 0.99 and self.call(
                "ChangeMessageVisibility",
                self.sqs.change_message_visibility,
                QueueUrl=url,
                ReceiptHandle=m["ReceiptHandle"],
                VisibilityTimeout=self.rng.choice([1, 5, 30]),
            ):
                fleet_counters.count(released=1)
        if done:
            reply = self.call(
                "DeleteMessageBatch", self.sqs.delete_message_batch, QueueUrl=url, Entries=done
            )
            fleet_counters.count(acked=len((reply or {}).get("Successful", [])))


class SqsProducer(SqsProducerBase):
    """An SQS producer."""


class SqsConsumer(SqsConsumerBase):
    """An SQS consumer."""
