"""Why a message failed, through ``evq serve`` (issue 36): a release (native API, Python
client, CLI) may carry a reason; peek and browse show the last ones with the receive count,
the dead-letter queue keeps them, and they are never shown as a message attribute (native
takes, SQS receives)."""

from __future__ import annotations

from evq.client import Client
from tests.integration.conftest import Names
from tests.integration.server import Server, eventually, request, sqs_client
from tests.integration.test_cli import evq


def test_reasons_are_kept_shown_and_carried_into_the_dead_letter_queue(
    server: Server, names: Names
) -> None:
    dlq, queue = names("dlq"), names("work")
    with Client(server.url, retries=0, timeout=30) as c:
        c.create_queue(dlq)
        c.create_queue(queue, max_receives=3, dead_letter_queue=dlq)
        [put] = c.put(queue, [b"invoice 17"], attributes={"tenant": "acme"})

        [m] = c.take(queue)
        assert c.release(queue, m, reason="smtp: 421 try later")[0].status == "ok"
        [m] = c.take(queue)
        assert m.attributes == {"tenant": "acme"}  # the reasons are not an attribute
        r = evq(server.url, "release", queue, m.id, m.lease, "--reason", "smtp: timeout")
        assert r.code == 0, r
        peeked = c.get_message(queue, put.id)
        assert [f["reason"] for f in peeked.failures] == ["smtp: 421 try later", "smtp: timeout"]
        assert peeked.receive_count == 2
        assert peeked.failures[0]["at"] <= peeked.failures[1]["at"]
        r = evq(server.url, "peek", queue)
        assert "LAST FAILURE" in r.out, r
        assert "smtp: timeout" in r.out, r

        [m] = c.take(queue)
        status, doc = request(
            "POST",
            f"{server.url}/v1/queues/{queue}/release",
            {"items": [{"id": m.id, "lease": m.lease, "reason": "x" * 1025}]},
        )
        assert (status, doc["error"]["code"]) == (400, "BadRequest")
        status, doc = request(
            "POST",
            f"{server.url}/v1/queues/{queue}/release",
            {"items": [{"id": m.id, "lease": m.lease, "reason": "bad address"}]},
        )
        assert (status, doc["results"][0]["status"]) == (200, "ok")  # the third: dead

        eventually(lambda: c.get_queue(dlq).stats.ready == 1, timeout=30, what="the letter")  # type: ignore[union-attr]
        [letter] = c.browse(dlq).messages
        reasons = [f["reason"] for f in letter.failures]
        assert reasons == ["smtp: 421 try later", "smtp: timeout", "bad address"]
        assert letter.attributes["tenant"] == "acme"
        assert "evq.failures" not in letter.attributes

        sqs = sqs_client(server)
        url = sqs.get_queue_url(QueueName=dlq)["QueueUrl"]
        got = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"])
        [received] = got["Messages"]
        assert set(received["MessageAttributes"]) == {"tenant"}
