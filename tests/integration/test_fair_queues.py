"""Fair queues through ``evq serve`` (issue 36): a queue created fair (CLI, native API,
Python client) hands out its groups' messages turn by turn, over the native API and SQS
alike; ``fair`` shows in the settings, changes live (API, ``evq configure``, client), is
refused where it has no meaning, and the groups' turns survive a restart. (The engine:
tests/unit/core/test_fair.py.)"""

from __future__ import annotations

from evq.client import Client, NewMessage
from tests.integration.conftest import Names, ServerFactory
from tests.integration.server import request, sqs_client
from tests.integration.test_cli import evq

NOISY = 200


def noisy_then_quiet(c: Client, queue: str) -> None:
    """A backlog of one group, then one message each of three others (and one without)."""
    c.put(queue, [f"n{i}" for i in range(NOISY)], group="noisy")
    c.put(queue, [NewMessage(body=g, group=g) for g in ("a", "b", "c")])
    c.put(queue, "solo")


def test_a_fair_queue_serves_every_group_before_a_noisy_ones_backlog_and_keeps_turns(
    make_server: ServerFactory, names: Names
) -> None:
    server = make_server("--shards", "2")
    fair, plain = names("fair"), names("plain")
    r = evq(server.url, "--json", "create", fair, "--fair")
    assert r.code == 0, r
    assert r.docs()[0]["settings"]["fair"] is True, r
    with Client(server.url, retries=0, timeout=30) as c:
        c.create_queue(plain)
        assert c.get_queue(plain).settings.fair is False
        for q in (fair, plain):
            noisy_then_quiet(c, q)
        got = [m.body for m in c.take(fair, 6)]
        assert got == [b"n0", b"a", b"b", b"c", b"solo", b"n1"]
        assert [m.body for m in c.take(plain, 6)] == [b"n%d" % i for i in range(6)]

        # the turns are durable: after a restart the noisy group still waits its turn
        c.put(fair, NewMessage(body="a2", group="a"))
        assert server.stop() == 0
        server.start()
    with Client(server.url, retries=0, timeout=30) as c:
        c.put(fair, [NewMessage(body="d", group="d")])
        assert [m.body for m in c.take(fair, 3)] == [b"a2", b"d", b"n2"]

        # off while messages wait: the oldest first again; on again: turns anew
        status, doc = request("PATCH", f"{server.url}/v1/queues/{fair}", {"fair": False})
        assert (status, doc["settings"]["fair"]) == (200, False), doc
        c.put(fair, NewMessage(body="late", group="late"))
        assert [m.body for m in c.take(fair, 2)] == [b"n3", b"n4"]
        r = evq(server.url, "configure", fair, "--fair", "--max-in-flight", "100")
        assert (r.code, r.out.strip()) == (0, f"{fair}: max_in_flight 100, fair True"), r
        assert [m.body for m in c.take(fair, 2)] == [b"n5", b"late"]
        c.update_queue(fair, max_in_flight=None)
        assert c.get_queue(fair).settings.max_in_flight is None
        assert c.get_queue(fair).settings.fair is True


def test_sqs_receives_of_a_fair_queue_take_turns_across_message_groups(
    make_server: ServerFactory, names: Names
) -> None:
    server = make_server()
    queue = names("fair-sqs")
    with Client(server.url, retries=0, timeout=30) as c:
        c.create_queue(queue, fair=True)
    sqs = sqs_client(server)
    url = sqs.get_queue_url(QueueName=queue)["QueueUrl"]
    for start in range(0, 50, 10):
        sqs.send_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(i), "MessageBody": f"n{i}", "MessageGroupId": "noisy"}
                for i in range(start, start + 10)
            ],
        )
    for g in ("t1", "t2"):
        sqs.send_message(QueueUrl=url, MessageBody=g, MessageGroupId=g)
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=4, AttributeNames=["All"])
    bodies = [m["Body"] for m in got["Messages"]]
    assert bodies == ["n0", "t1", "t2", "n1"]
    assert got["Messages"][1]["Attributes"]["MessageGroupId"] == "t1"


def test_fair_is_refused_on_a_fifo_queue_and_must_be_a_boolean(
    make_server: ServerFactory, names: Names
) -> None:
    server = make_server()
    fifo, plain = names("jobs", fifo=True), names("plain")
    status, doc = request("PUT", f"{server.url}/v1/queues/{fifo}", {"fair": True})
    assert (status, doc["error"]["code"]) == (400, "BadRequest"), doc
    assert "standard queues" in doc["error"]["message"]
    status, doc = request("PUT", f"{server.url}/v1/queues/{plain}", {"fair": "yes"})
    assert (status, doc["error"]["code"]) == (400, "BadRequest"), doc
    status, _ = request("PUT", f"{server.url}/v1/queues/{plain}", {})
    assert status in (200, 201)
    status, doc = request("PATCH", f"{server.url}/v1/queues/{plain}", {"fair": 1})
    assert (status, doc["error"]["code"]) == (400, "BadRequest"), doc
    status, doc = request("GET", f"{server.url}/v1/queues/{plain}")
    assert doc["settings"]["fair"] is False  # nothing refused was kept
