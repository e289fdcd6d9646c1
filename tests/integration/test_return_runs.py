"""Messages given back with a backoff (issue 33; runs.py, ``Run.lend``) through a real
``evq serve``: a batch a consumer releases with a delay goes back into its put's run as one
return run, not one object per message; every command still sees each message, with its
receive count; it survives a graceful restart, a SIGKILL (replayed from the log) and a
compaction, and comes back in order with its body."""

from __future__ import annotations

import time
from typing import Any

import pytest

from evq.client import Client, NewMessage
from tests.integration.conftest import Names, ServerFactory
from tests.integration.server import server_env
from tests.integration.test_spilled_attributes import attrs, spilled
from tests.integration.test_sqs_server import KEY, SECRET, client
from tests.unit.gateway.sqs_support import expected_md5

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_a_released_batch_is_held_as_a_return_run_through_restarts_and_kills(
    make_server: ServerFactory, names: Names
) -> None:
    server = make_server("--shards", "1")
    q = names("backoff")
    n = 300
    with Client(server.url, retries=0, timeout=20) as c:
        c.create_queue(q)
        ids = [
            r.id
            for r in c.put(q, [NewMessage(body=f"b{i}", attributes=attrs(i)) for i in range(n)])
        ]
        taken = c.take(q, n, visibility_timeout=600)
        assert [t.id for t in taken] == ids
        assert spilled(server.url, q) == 0  # taken: messages, each with its lease
        results = c.release(q, *taken, delay=3600)
        assert {r.status for r in results} == {"ok"}
        assert spilled(server.url, q) == n  # given back: one return run, no message objects
        m = c.get_message(q, ids[17])
        assert (m.state, m.body, m.receive_count, m.attributes) == ("delayed", b"b17", 1, attrs(17))
        listed = c.browse_all(q, "delayed", limit=64)
        assert [x.id for x in listed] == ids
        assert c.get_queue(q).stats.delayed == n
        # one of them is run now: it leaves the return run, ready, its count kept
        c.update_message(q, ids[3], delay=0)
        [again] = c.take(q, 1, visibility_timeout=600)
        assert (again.id, again.body, again.receive_count) == (ids[3], b"b3", 2)
        c.ack(q, again)

    assert server.stop() == 0  # graceful: the snapshot holds the return run
    server.start()
    batch = ids[20:40]
    with Client(server.url, retries=0, timeout=20) as c:
        assert spilled(server.url, q) == n - 1
        m = c.get_message(q, ids[250])
        assert (m.state, m.receive_count, m.attributes) == ("delayed", 1, attrs(250))
        for mid in batch:  # run now, taken again and given back: a return run (received twice)
            c.update_message(q, mid, delay=0)
        taken = c.take(q, 20, visibility_timeout=600)
        assert [(t.id, t.receive_count) for t in taken] == [(mid, 2) for mid in batch]
        assert spilled(server.url, q) == n - 1 - 20
        released = time.time()
        c.release(q, *taken, delay=15)
        assert spilled(server.url, q) == n - 1

    server.kill()  # SIGKILL: the release since the snapshot is replayed from the log
    server.start()
    with Client(server.url, retries=0, timeout=20) as c:
        assert spilled(server.url, q) == n - 1
        m = c.get_message(q, batch[5])
        # the replayed release keeps its delay; whether it is still delayed depends on how
        # long the restart took (over 15 s on a slow host), so its due time is what we check
        assert (m.body, m.receive_count) == (b"b25", 2)
        assert released + 14.5 <= m.activate_at <= released + 25
        if time.time() < m.activate_at - 0.5:
            assert m.state == "delayed"
        deadline = time.monotonic() + 30
        while c.get_message(q, batch[0]).state != "ready" and time.monotonic() < deadline:
            time.sleep(0.5)
        got = c.take(q, 30, visibility_timeout=600)
        assert [(t.id, t.body, t.receive_count) for t in got] == [
            (mid, f"b{20 + k}".encode(), 3) for k, mid in enumerate(batch)
        ]
        assert [t.attributes for t in got] == [attrs(20 + k) for k in range(20)]
        c.ack(q, *got)
        stats = c.get_queue(q).stats
        assert (stats.delayed, stats.ready, stats.reserved) == (n - 21, 0, 0)


def test_sqs_receives_whose_visibility_runs_out_go_back_into_their_run(
    make_server: ServerFactory, names: Names
) -> None:
    """An SQS consumer that receives batches of 10 and never deletes them (it died): when
    their visibility timeouts run out, each batch goes back into its put's run as a return
    run, and is received again with its attributes and a receive count of 2."""
    server = make_server("--shards", "1", env=server_env(EVQ_SQS_KEYS=f"{KEY}:{SECRET}"))
    sqs: Any = client(server, KEY, SECRET)
    name = names("sqsback")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sent = {"kind": {"DataType": "String", "StringValue": "invoice"}}
    with Client(server.url, retries=0, timeout=20) as c:  # one put: one run
        c.put(
            name, [NewMessage(body=f"job {i}", attributes={"kind": "invoice"}) for i in range(50)]
        )
    assert spilled(server.url, name) == 50
    first: list[dict[str, Any]] = []
    for _ in range(5):
        reply = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=2, AttributeNames=["All"]
        )
        first += reply["Messages"]
    assert [m["Body"] for m in first] == [f"job {i}" for i in range(50)]
    assert spilled(server.url, name) == 0  # in flight: messages, each with its lease
    deadline = time.monotonic() + 30
    while spilled(server.url, name) < 50 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert spilled(server.url, name) == 50  # the five batches back in their run
    again: list[dict[str, Any]] = []
    while len(again) < 50:
        reply = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=600,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        assert reply.get("Messages"), "the batches did not come back"
        again += reply["Messages"]
    assert [m["Body"] for m in again] == [f"job {i}" for i in range(50)]
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in again} == {"2"}
    assert all(m["MessageAttributes"] == sent for m in again)
    assert all(m["MD5OfMessageAttributes"] == expected_md5(sent) for m in again)
    sqs.close()


def test_messages_given_back_one_at_a_time_cost_no_objects_through_restarts_and_kills(
    make_server: ServerFactory, names: Names
) -> None:
    """A consumer that fails messages one by one, each with a backoff of its own, and an
    operator who reschedules messages one at a time: each goes back into its put's
    scattered return run (runs.py, ``Run.scatter``), not an object; every command sees it,
    in activation order, through a graceful restart and a SIGKILL."""
    server = make_server("--shards", "1")
    q = names("scatter")
    n = 120
    with Client(server.url, retries=0, timeout=20) as c:
        c.create_queue(q)
        ids = [
            r.id
            for r in c.put(q, [NewMessage(body=f"b{i}", attributes=attrs(i)) for i in range(n)])
        ]
        later = [r.id for r in c.put(q, [NewMessage(body=f"l{i}") for i in range(40)])]
        taken = c.take(q, n, visibility_timeout=600)
        assert spilled(server.url, q) == 40  # the taken ones are messages, with leases
        for k, t in enumerate(taken):  # each alone, the last ones due first
            assert [r.status for r in c.release(q, t, delay=3600 + n - k)] == ["ok"]
        assert spilled(server.url, q) == n + 40
        for k, mid in enumerate(later[::2]):  # rescheduled one at a time, never taken
            assert c.update_message(q, mid, delay=7200 + k).state == "delayed"
        assert spilled(server.url, q) == n + 40
        m = c.get_message(q, ids[17])
        assert (m.state, m.body, m.receive_count, m.attributes) == ("delayed", b"b17", 1, attrs(17))
        listed = [x.id for x in c.browse_all(q, "delayed", limit=32)]
        assert listed == ids[::-1] + later[::2]
        stats = c.get_queue(q).stats
        assert (stats.delayed, stats.ready, stats.reserved) == (n + 20, 20, 0)

    assert server.stop() == 0  # graceful: the snapshot holds the scattered runs
    server.start()
    with Client(server.url, retries=0, timeout=20) as c:
        assert spilled(server.url, q) == n + 40
        for mid in ids[:3]:  # due in a second or two now, alone again
            c.update_message(q, mid, delay=1)
        assert spilled(server.url, q) == n + 40

    server.kill()  # SIGKILL: the reschedules since the snapshot are replayed from the log
    server.start()
    with Client(server.url, retries=0, timeout=20) as c:
        ready: list[Any] = []
        deadline = time.monotonic() + 30
        while len(ready) < 23 and time.monotonic() < deadline:
            time.sleep(0.3)
            ready = list(c.browse_all(q, "ready", limit=32))
        assert len(ready) == 23
        # the three due now woke as ready messages; the rest are where they were
        assert spilled(server.url, q) == n + 40 - 3
        m = c.get_message(q, ids[2])
        assert (m.state, m.receive_count, m.attributes) == ("ready", 1, attrs(2))
        m = c.get_message(q, ids[50])
        assert (m.state, m.receive_count, m.attributes) == ("delayed", 1, attrs(50))
        got = c.take(q, 30, visibility_timeout=600)
        assert sorted(t.id for t in got) == sorted(later[1::2] + ids[:3])
        back = {t.id: t for t in got if t.id in ids[:3]}
        assert [
            (back[mid].body, back[mid].receive_count, back[mid].attributes) for mid in ids[:3]
        ] == [(f"b{i}".encode(), 2, attrs(i)) for i in range(3)]
        c.ack(q, *got)
        stats = c.get_queue(q).stats
        assert (stats.delayed, stats.ready, stats.reserved) == (n - 3 + 20, 0, 0)
