"""Pausing a queue through ``evq serve`` (issue 36): the native API, the CLI and the Python
client pause and resume; while paused, native takes (long-polls too) and SQS receives hand
out nothing while puts are accepted; the state shows in stats, the ``queue:`` key and
/metrics, and it survives a restart. (Handlers: tests/integration/test_handlers.py.)"""

from __future__ import annotations

import re
import threading
import time
import urllib.request

from evq.client import Client, Message
from tests.integration.conftest import Names, ServerFactory
from tests.integration.server import Server, request, sqs_client
from tests.integration.test_cli import evq


def paused_metric(server: Server, queue: str) -> float | None:
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = re.search(rf'^evq_queue_paused{{queue="{re.escape(queue)}"}} (\S+)$', text, re.M)
    return None if found is None else float(found.group(1))


def test_a_paused_queue_hands_out_nothing_anywhere_and_stays_paused_through_a_restart(
    make_server: ServerFactory, names: Names
) -> None:
    server = make_server("--shards", "2")
    queue = names("paused")
    with Client(server.url, retries=0, timeout=30) as c:
        c.create_queue(queue)
        c.put(queue, [b"a", b"b", b"c"])

        # the CLI pauses; everything that takes gets nothing, puts go on
        r = evq(server.url, "pause", queue)
        assert (r.code, r.out.strip()) == (0, f"{queue}: paused"), r
        assert c.take(queue, 10) == []
        started = time.monotonic()
        assert c.take(queue, 10, wait=1) == []  # a long-poll waits its whole time
        assert time.monotonic() - started >= 0.9
        sqs = sqs_client(server)
        url = sqs.get_queue_url(QueueName=queue)["QueueUrl"]
        assert "Messages" not in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
        assert [r.status for r in c.put(queue, [b"d"])] == ["created"]
        sqs.send_message(QueueUrl=url, MessageBody="e")

        # every view says so
        stats = c.get_queue(queue).stats
        assert stats is not None
        assert (stats.paused, stats.ready) == (True, 5)
        assert c.get_key(f"queue:{queue}").value["paused"] is True
        assert paused_metric(server, queue) == 1.0
        r = evq(server.url, "--json", "stats", queue)
        assert r.docs()[0]["stats"]["paused"] is True, r

        # a long-poll take waiting when the client resumes gets the messages at once
        got: list[list[Message]] = []
        with Client(server.url, retries=0, timeout=30) as waiter:
            poll = threading.Thread(target=lambda: got.append(waiter.take(queue, 10, wait=20)))
            started = time.monotonic()
            poll.start()
            time.sleep(1)
            assert c.resume(queue) is False
            poll.join(25)
        assert time.monotonic() - started < 10
        assert sorted(m.body for m in got[0]) == [b"a", b"b", b"c", b"d", b"e"]
        c.ack(queue, *got[0])
        assert paused_metric(server, queue) == 0.0

        # the native API pauses; a restart keeps it; SQS receives nothing meanwhile
        status, doc = request("POST", f"{server.url}/v1/queues/{queue}/pause")
        assert (status, doc) == (200, {"paused": True})
        assert request("POST", f"{server.url}/v1/queues/{queue}/pause") == (200, {"paused": True})
        c.put(queue, [b"f"])
    server.stop()
    server.start()
    with Client(server.url, retries=3, timeout=30) as c:
        stats = c.get_queue(queue).stats
        assert stats is not None
        assert (stats.paused, stats.ready) == (True, 1)
        sqs = sqs_client(server)
        got_sqs = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        assert "Messages" not in got_sqs
        r = evq(server.url, "--json", "resume", queue)
        assert (r.code, r.docs()) == (0, [{"name": queue, "paused": False}]), r
        got_sqs = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=5)
        assert [m["Body"] for m in got_sqs["Messages"]] == ["f"]


def test_pause_answers_errors_in_the_api_s_model(server: Server, names: Names) -> None:
    missing = names("missing")
    status, doc = request("POST", f"{server.url}/v1/queues/{missing}/pause")
    assert (status, doc["error"]["code"]) == (404, "QueueNotFound")
    queue = names()
    with Client(server.url, retries=0, timeout=30) as c:
        c.create_queue(queue)
        status, doc = request("POST", f"{server.url}/v1/queues/{queue}/pause", data=b"[1]")
        assert (status, doc["error"]["code"]) == (400, "BadRequest")
        assert c.get_queue(queue).stats.paused is False  # type: ignore[union-attr]
        status, doc = request("POST", f"{server.url}/v1/queues/{queue}/resume", {})
        assert (status, doc) == (200, {"paused": False})
        assert evq(server.url, "pause", missing).code != 0
