"""Messages with attributes held in runs (issue 33; actors/core/runs.py) through a real
``evq serve``: their attributes stay in the log with their bodies, every command on such a
message shows them, they survive a graceful restart and a SIGKILL, and SQS clients (boto3)
get them back with the right MD5 from a queue deep enough that their small batches spill."""

from __future__ import annotations

import re
import time
import urllib.request
from typing import Any

import pytest

from actors.core.state import RUN_DEPTH
from evq.client import Client, NewMessage
from tests.integration.conftest import Names, ServerFactory
from tests.integration.server import server_env
from tests.integration.test_sqs_server import KEY, SECRET, client
from tests.unit.gateway.sqs_support import expected_md5

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def spilled(url: str, queue: str) -> int:
    """The queue's ``evq_queue_spilled_messages`` on the server's /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=20) as resp:
        text = resp.read().decode()
    found = re.search(
        rf'^evq_queue_spilled_messages{{queue="{re.escape(queue)}"}} (\S+)$', text, re.M
    )
    assert found is not None, f"no spilled gauge for {queue}"
    return int(float(found.group(1)))


def attrs(i: int) -> dict[str, str]:
    return {"tenant": f"t{i % 7}", "trace": f"trace-{i:04d}"}


def put_with_attrs(c: Client, q: str, tag: str, n: int, delay: float | None = None) -> list[str]:
    """One put of ``n`` messages ``{tag}{i}`` with :func:`attrs` (a run): their ids."""
    messages = [NewMessage(body=f"{tag}{i}", attributes=attrs(i), delay=delay) for i in range(n)]
    return [r.id for r in c.put(q, messages)]


def test_native_messages_with_attributes_spill_and_keep_them_through_restarts(
    make_server: ServerFactory, names: Names
) -> None:
    server = make_server("--shards", "1")
    q = names("attrs")
    with Client(server.url, retries=0, timeout=20) as c:
        c.create_queue(q)
        ready = put_with_attrs(c, q, "r", 200)
        later = put_with_attrs(c, q, "d", 100, delay=3600)
        assert spilled(server.url, q) == 300  # no message objects: all in runs
        m = c.get_message(q, ready[5])
        assert (m.body, m.attributes) == (b"r5", attrs(5))
        m = c.get_message(q, later[9])
        assert (m.state, m.attributes) == ("delayed", attrs(9))
        listed = c.browse_all(q, "delayed", limit=40)
        assert [(x.id, x.attributes) for x in listed] == [
            (mid, attrs(i)) for i, mid in enumerate(later)
        ]
        c.update_message(q, later[1], body="changed")  # leaves its run, keeps its attributes
        assert c.get_message(q, later[1]).attributes == attrs(1)

    assert server.stop() == 0  # graceful: the queue's snapshot holds its runs
    server.start()
    with Client(server.url, retries=0, timeout=20) as c:
        got = c.take(q, 50, visibility_timeout=600)
        assert [(x.id, x.body, x.attributes) for x in got] == [
            (mid, f"r{i}".encode(), attrs(i)) for i, mid in enumerate(ready[:50])
        ]
        c.put(q, [NewMessage(body=f"k{i}", attributes=attrs(i)) for i in range(100)])  # log only

    server.kill()  # SIGKILL: the last put is replayed from the log
    server.start()
    with Client(server.url, retries=0, timeout=20) as c:
        assert c.get_message(q, later[1]).attributes == attrs(1)
        assert c.get_message(q, later[99]).attributes == attrs(99)
        got = c.take(q, 1000, visibility_timeout=600)  # the first take's 50 are still held
        assert [x.attributes for x in got] == [attrs(i) for i in range(50, 200)] + [
            attrs(i) for i in range(100)
        ]
        assert got[-1].body == b"k99"


def test_sqs_batches_with_message_attributes_spill_in_a_deep_queue_and_come_back_whole(
    make_server: ServerFactory, names: Names
) -> None:
    server = make_server("--shards", "1", env=server_env(EVQ_SQS_KEYS=f"{KEY}:{SECRET}"))
    sqs: Any = client(server, KEY, SECRET)
    name = names("sqsattrs")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    with Client(server.url, retries=0, timeout=20) as c:  # deep enough that small puts spill
        for _ in range(RUN_DEPTH // 1000):
            c.put(name, ["filler"] * 1000)
            c.put(name, ["later filler"] * 1000, delay=3600)  # and small delayed ones
    sent_attrs = {
        "kind": {"DataType": "String", "StringValue": "invoice"},
        "amount": {"DataType": "Number", "StringValue": "12.5"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xff"},
    }
    sent = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": f"m{i}", "MessageBody": f"body {i}", "MessageAttributes": sent_attrs}
            for i in range(10)
        ],
    )
    assert len(sent["Successful"]) == 10
    assert spilled(server.url, name) == 2 * RUN_DEPTH + 10  # the batch is a run too
    delayed = sqs.send_message_batch(  # each with its own DelaySeconds: a spread run
        QueueUrl=url,
        Entries=[
            {
                "Id": f"d{i}",
                "MessageBody": f"later {i}",
                "MessageAttributes": sent_attrs,
                "DelaySeconds": 3 + i % 4,
            }
            for i in range(10)
        ],
    )
    assert len(delayed["Successful"]) == 10
    assert spilled(server.url, name) == 2 * RUN_DEPTH + 20
    sqs.close()

    server.kill()
    server.start()
    sqs = client(server, KEY, SECRET)
    with Client(server.url, retries=0, timeout=20) as c:
        for _ in range(RUN_DEPTH // 1000):  # the filler, out of the way
            assert len(c.take(name, 1000, visibility_timeout=600)) == 1000
    got: list[dict[str, Any]] = []
    while len(got) < 10:
        reply = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            MessageAttributeNames=["All"],
            VisibilityTimeout=600,
        )
        assert reply.get("Messages"), "the batch's messages did not come back"
        got += reply["Messages"]
    assert sorted(m["Body"] for m in got) == sorted(f"body {i}" for i in range(10))
    later: list[dict[str, Any]] = []  # the delayed batch, as each message's time comes
    deadline = time.monotonic() + 60
    while len(later) < 10 and time.monotonic() < deadline:
        reply = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            MessageAttributeNames=["All"],
            VisibilityTimeout=600,
            WaitTimeSeconds=2,
        )
        later += reply.get("Messages", [])
    assert sorted(m["Body"] for m in later) == sorted(f"later {i}" for i in range(10))
    for m in got + later:
        assert m["MessageAttributes"] == sent_attrs
        assert m["MD5OfMessageAttributes"] == expected_md5(sent_attrs)
    sqs.close()


def test_every_command_on_spilled_messages_with_attributes_keeps_or_ends_them(
    make_server: ServerFactory, names: Names
) -> None:
    server = make_server("--shards", "1")
    q = names("attrcmds")
    with Client(server.url, retries=0, timeout=20) as c:
        c.create_queue(q)
        ids = put_with_attrs(c, q, "m", 100)
        later = put_with_attrs(c, q, "d", 100, delay=3600)
        assert spilled(server.url, q) == 200
        c.delete_message(q, ids[10])  # a ready one, out of its run's order
        c.delete_message(q, later[10])  # a delayed one
        c.reschedule(q, later[20], delay=0)  # due now: ready, with its attributes
        c.reschedule(q, ids[30], delay=3600)  # due later
        taken = c.take(q, 3, visibility_timeout=600)
        assert [(x.id, x.attributes) for x in taken] == [(ids[i], attrs(i)) for i in range(3)]
        assert all(r.ok for r in c.touch(q, *taken, visibility_timeout=900))
        assert all(r.ok for r in c.release(q, *taken[:2], delay=3600))
        assert [r.ok for r in c.ack(q, taken[2])] == [True]
        m = c.get_message(q, ids[1])
        assert (m.state, m.attributes) == ("delayed", attrs(1))  # released later
        assert c.get_message(q, ids[30]).attributes == attrs(30)
        ready = c.take(q, 1000, visibility_timeout=600)
        want = [i for i in range(3, 100) if i not in (10, 30)]
        assert [x.id for x in ready] == [ids[i] for i in want] + [later[20]]  # by time
        assert [x.attributes for x in ready] == [attrs(i) for i in want] + [attrs(20)]

    server.kill()
    server.start()
    with Client(server.url, retries=0, timeout=20) as c:
        stats = c.get_queue(q).stats
        assert stats is not None
        # 98 ready ones taken (reserved), 2 released and 1 rescheduled later, 98 still delayed
        assert (stats.reserved, stats.delayed, stats.total) == (len(want) + 1, 101, 200 - 3)
        assert c.get_message(q, later[99]).attributes == attrs(99)
        assert c.purge(q) == 200 - 3
        assert c.get_queue(q).stats.total == 0  # type: ignore[union-attr]
        assert spilled(server.url, q) == 0
