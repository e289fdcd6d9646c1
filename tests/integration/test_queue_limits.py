"""Per-queue limits through ``evq serve`` (issue 36): ``take_rate``, ``put_rate`` and
``max_in_flight``, set at creation or live (PATCH), hold for native takes, long-polls and SQS
receives alike (they are kept where the queue lives); a put past the rate is a 429 with
Retry-After, which the Python client waits out."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest

from evq.client import Client, RetryPolicy
from tests.integration.conftest import Names
from tests.integration.server import Server, request, sqs_client


def test_max_in_flight_holds_for_native_takes_and_sqs_receives(
    server: Server, names: Names
) -> None:
    queue = names()
    with Client(server.url, retries=0, timeout=30) as c:
        info = c.create_queue(queue, max_in_flight=5)
        assert info.settings.max_in_flight == 5
        c.put(queue, [b"m"] * 20)
        taken = c.take(queue, 10)
        assert len(taken) == 5
        sqs = sqs_client(server)
        url = sqs.get_queue_url(QueueName=queue)["QueueUrl"]
        assert "Messages" not in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
        c.ack(queue, *taken[:2])
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
        assert len(got) == 2
        # a long-poll take waiting at the limit gets a message as soon as one is acked
        c.ack(queue, *taken[2:4])
        assert len(c.take(queue, 10, wait=5)) == 2
        c.update_queue(queue, max_in_flight=None)  # lifted live
        assert len(c.take(queue, 20)) == 11
        assert c.get_queue(queue).settings.max_in_flight is None


def test_a_take_rate_paces_every_consumer_together(server: Server, names: Names) -> None:
    queue = names()
    with Client(server.url, retries=0, timeout=30) as c:
        c.create_queue(queue)
        c.put(queue, [b"m"] * 500)
        c.update_queue(queue, take_rate=20)  # set live
        sqs = sqs_client(server)
        url = sqs.get_queue_url(QueueName=queue)["QueueUrl"]
        started = time.monotonic()
        taken = 0
        while time.monotonic() - started < 3:
            taken += len(c.take(queue, 10, wait=0.5))
            got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
            taken += len(got.get("Messages", []))
        elapsed = time.monotonic() - started
        # a second's worth at once, then 20 a second: never more, whoever asks
        assert taken <= 20 + 20 * elapsed + 1, (taken, elapsed)
        assert taken >= 20 + 20 * 2, (taken, elapsed)  # the long-polls woke for each token


def test_a_put_past_the_put_rate_is_a_429_with_retry_after(server: Server, names: Names) -> None:
    queue = names()
    with Client(server.url, retries=0, timeout=30) as c:
        c.create_queue(queue, put_rate=2)
        c.put(queue, [b"a"])
        c.put(queue, [b"b"])
    req = urllib.request.Request(
        f"{server.url}/v1/queues/{queue}/messages",
        data=b'{"messages": [{"body": "c"}]}',
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=10)
    assert (refused.value.code, refused.value.headers["Retry-After"]) == (429, "1")
    assert b"put_rate" in refused.value.read()
    patient = RetryPolicy(retries=5, backoff=0.2, max_backoff=2)
    with Client(server.url, retries=patient, timeout=30) as c:
        started = time.monotonic()
        c.put(queue, [b"c"])  # waits the Retry-After out
        assert time.monotonic() - started >= 0.2
        assert c.get_queue(queue).stats.total == 3  # type: ignore[union-attr]
    status, doc = request("PATCH", f"{server.url}/v1/queues/{queue}", {"put_rate": 0})
    assert (status, doc["error"]["code"]) == (400, "BadRequest")
