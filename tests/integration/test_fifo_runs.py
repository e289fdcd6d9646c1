"""A FIFO queue that spills (issue 33; state.py, ``Group.rest``) through a real ``evq
serve``: a put's messages are held in one run, each group keeping only its head as an
object; every command still sees each message; takes (native and SQS) hand out a stretch of
one group in order; a graceful restart and a SIGKILL (replayed from the log) keep the
groups and their order; every message is handed out once, in its group's order."""

from __future__ import annotations

import time
from typing import Any

import pytest

from evq.client import Client, NewMessage
from tests.integration.conftest import Names, ServerFactory
from tests.integration.server import server_env
from tests.integration.test_spilled_attributes import spilled
from tests.integration.test_sqs_server import KEY, SECRET, client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

GROUPS = 10


def group_of(i: int) -> str:
    return f"tenant-{i % GROUPS}"


def test_a_fifo_queue_holds_its_groups_in_runs_through_restarts_and_kills(
    make_server: ServerFactory, names: Names
) -> None:
    server = make_server("--shards", "1", env=server_env(EVQ_SQS_KEYS=f"{KEY}:{SECRET}"))
    q = names("orders") + ".fifo"
    n = 600
    with Client(server.url, retries=0, timeout=20) as c:
        c.create_queue(q, fifo=True)
        news = [NewMessage(body=f"b{i}", group=group_of(i)) for i in range(n)]
        ids = [r.id for r in c.put(q, news)]
        assert spilled(server.url, q) == n - GROUPS  # one head a group is an object
        m = c.get_message(q, ids[333])
        assert (m.state, m.body) == ("ready", b"b333")
        listed = c.browse_all(q, "ready", limit=64)
        assert [x.id for x in listed] == ids
        assert spilled(server.url, q) == n - GROUPS  # reading materializes nothing
        taken = c.take(q, 5, visibility_timeout=600)
        assert [t.id for t in taken] == ids[0 : 5 * GROUPS : GROUPS]  # tenant-0, in order
        assert [t.body for t in taken] == [f"b{i}".encode() for i in range(0, 50, 10)]
        c.ack(q, *taken)
        c.update_message(q, ids[101], body=b"changed")  # tenant-1's 11th, out of turn
        c.delete_message(q, ids[102])  # tenant-2's 11th
        stretch = c.take(q, 3, visibility_timeout=600)  # tenant-1's first three
        assert [t.id for t in stretch] == [ids[1], ids[11], ids[21]]
        assert {r.status for r in c.touch(q, *stretch, visibility_timeout=900)} == {"ok"}
        assert {r.status for r in c.release(q, *stretch)} == {"ok"}  # back, at their place
        c.reschedule(q, ids[599], delay=3600)  # tenant-9's last, out of turn
        assert c.get_message(q, ids[599]).state == "delayed"
        c.reschedule(q, ids[599], delay=0)
        assert c.get_message(q, ids[599]).state == "ready"

    assert server.stop() == 0  # graceful: the snapshot holds the runs and the groups
    server.start()
    with Client(server.url, retries=0, timeout=20) as c:
        # gone: five acked, one deleted; objects: the heads, one rescheduled out of turn,
        # and tenant-1's two released behind its head (the one updated stays: a patch)
        assert spilled(server.url, q) == n - 5 - 1 - GROUPS - 1 - 2
        assert c.get_message(q, ids[101]).body == b"changed"
        # tenant-1's head came back at its release: later than tenant-2's, put with it
        taken = c.take(q, 3, visibility_timeout=600)
        assert [t.id for t in taken] == [ids[2], ids[12], ids[22]]
        c.ack(q, *taken)
        m = c.get_message(q, ids[11])
        assert (m.state, m.receive_count) == ("ready", 1)

    server.kill()  # SIGKILL: what happened since the snapshot is replayed from the log
    server.start()
    sqs: Any = client(server, KEY, SECRET)
    url = sqs.get_queue_url(QueueName=q)["QueueUrl"]
    reply = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=600)
    got = reply["Messages"]
    # the oldest head is tenant-3's first: SQS hands out a run of its group
    assert [m["Body"] for m in got] == [f"b{i}" for i in range(3, 103, 10)]
    for m in got:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    sqs.close()

    seen: dict[str, list[int]] = {}
    with Client(server.url, retries=0, timeout=20) as c:
        while True:
            taken = c.take(q, 100, visibility_timeout=600)
            if not taken:
                break
            for t in taken:
                i = ids.index(t.id)
                seen.setdefault(group_of(i), []).append(i)
                assert t.body == (b"changed" if i == 101 else f"b{i}".encode())
                assert t.receive_count == (2 if i in (1, 11, 21) else 1)  # released once
            c.ack(q, *taken)
        stats = c.get_queue(q).stats
        assert (stats.ready, stats.reserved, stats.delayed) == (0, 0, 0)
    handed = {0: 5, 2: 3, 3: 10}  # before the drain
    for g in range(GROUPS):
        members = [i for i in range(n) if i % GROUPS == g and i != 102]
        assert seen[group_of(g)] == members[handed.get(g, 0) :], g  # in order, each once


def test_an_sqs_fifo_queue_with_a_delay_holds_its_batches_as_runs(
    make_server: ServerFactory, names: Names
) -> None:
    """An SQS FIFO queue with DelaySeconds, 10,000 messages deep: each SendMessageBatch is
    one run, waiting (a batch into a shallow queue stays messages: taken soon), only each
    group's head an object; nothing is received before the delay, then each group in
    order."""
    server = make_server("--shards", "1", env=server_env(EVQ_SQS_KEYS=f"{KEY}:{SECRET}"))
    sqs: Any = client(server, KEY, SECRET)
    name = names("delayed") + ".fifo"
    url = sqs.create_queue(
        QueueName=name,
        Attributes={"FifoQueue": "true", "DelaySeconds": "3", "ContentBasedDeduplication": "true"},
    )["QueueUrl"]
    with Client(server.url, retries=0, timeout=20) as c:  # the depth: 10 puts of 1000
        for b in range(10):
            c.put(name, [NewMessage(body=f"n{b}-{i}", group=f"g{i % 2}") for i in range(1000)])
    assert spilled(server.url, name) == 10_000 - 2  # each group's head is a message
    for b in range(3):
        entries = [
            {"Id": str(i), "MessageBody": f"job {b}-{i}", "MessageGroupId": f"g{i % 2}"}
            for i in range(10)
        ]
        assert len(sqs.send_message_batch(QueueUrl=url, Entries=entries)["Successful"]) == 10
    assert spilled(server.url, name) == 10_030 - 2  # the batches are runs too
    assert not sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages")
    deadline = time.monotonic() + 30
    got: list[dict[str, Any]] = []
    while not got and time.monotonic() < deadline:
        reply = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=600, WaitTimeSeconds=1
        )
        got = reply.get("Messages", [])
    assert [m["Body"] for m in got] == [f"n0-{i}" for i in range(0, 20, 2)]  # g0, in order
    with Client(server.url, retries=0, timeout=20) as c:  # each put 3 s after its own
        while (stats := c.get_queue(name).stats).delayed and time.monotonic() < deadline:
            time.sleep(0.3)
        assert (stats.ready, stats.reserved, stats.delayed) == (10_020, 10, 0)
    sqs.close()


def test_a_fifo_put_each_message_due_at_its_own_time_spills_through_restarts(
    make_server: ServerFactory, names: Names
) -> None:
    """A FIFO put whose messages are each due at a time of their own (a retry schedule per
    tenant) is one run: only each group's head is an object; each message is ready in its
    group at its own time, a group waits on its head; a graceful restart and a SIGKILL
    while some are due and others not keep which is which; every message is handed out
    once, in its group's order, none before its time."""
    server = make_server("--shards", "1")
    q = names("retries") + ".fifo"
    n = 600
    # message i due 1.5..4.5 s on, not in put order within a group
    delays = [1.5 + ((i * 7) % 31) / 10 for i in range(n)]
    with Client(server.url, retries=0, timeout=20) as c:
        c.create_queue(q, fifo=True)
        start = time.time()
        news = [NewMessage(body=f"r{i}", group=group_of(i), delay=delays[i]) for i in range(n)]
        ids = [r.id for r in c.put(q, news)]
        assert spilled(server.url, q) == n - GROUPS  # one head a group is an object
        m = c.get_message(q, ids[333])
        assert (m.state, m.body) == ("delayed", b"r333")
        assert abs(m.activate_at - (start + delays[333])) < 1.0
        listed = [x.id for x in c.browse_all(q, "delayed", limit=64)]
        assert sorted(listed) == sorted(ids)
        want = sorted(range(n), key=lambda i: (delays[i], i))  # activation order
        assert listed == [ids[i] for i in want]
        assert not c.take(q, 10)  # nothing before its time
        assert spilled(server.url, q) == n - GROUPS  # reading materializes nothing
        due = {i: start + delays[i] for i in range(n)}
        # commands on spilled members: an edit (stays spilled), a delete, a reschedule
        assert c.update_message(q, ids[109], body=b"edited").body == b"edited"
        c.delete_message(q, ids[107])
        due[108] = c.update_message(q, ids[108], delay=4.0).activate_at
        assert spilled(server.url, q) == n - GROUPS - 2  # the deleted and rescheduled

    assert server.stop() == 0  # graceful: the snapshot holds the run half woken or not
    server.start()
    with Client(server.url, retries=0, timeout=20) as c:
        while time.time() < start + 2.6:
            time.sleep(0.1)  # some due (ready in their groups), most not (if the restart
        # was quick): each counted ready once its time came, blocked behind its head or not
        lo = sum(t <= time.time() - 0.05 for i, t in due.items() if i != 107)
        stats = c.get_queue(q).stats
        hi = sum(t <= time.time() + 0.05 for i, t in due.items() if i != 107)
        assert lo <= stats.ready <= hi
        assert stats.ready + stats.delayed == n - 1
    server.kill()  # SIGKILL: replayed from the log
    server.start()

    seen: dict[str, list[int]] = {}
    with Client(server.url, retries=0, timeout=20) as c:
        deadline = time.time() + 60
        while sum(len(v) for v in seen.values()) < n - 1 and time.time() < deadline:
            taken = c.take(q, 100, visibility_timeout=600)
            now = time.time()
            for t in taken:
                i = ids.index(t.id)
                assert now >= due[i] - 0.05, i  # not before its time
                seen.setdefault(group_of(i), []).append(i)
                assert t.body == (b"edited" if i == 109 else f"r{i}".encode())
            if taken:
                c.ack(q, *taken)
            else:
                time.sleep(0.2)
        stats = c.get_queue(q).stats
        assert (stats.ready, stats.reserved, stats.delayed) == (0, 0, 0)
    for g in range(GROUPS):
        want = [i for i in range(g, n, GROUPS) if i != 107]
        assert seen[group_of(g)] == want, g  # in order, each once
