"""Operations against a real ``evq serve`` with Ray and two gateway processes: tokens from
a file on every process, ``--auto-create`` on every process, /metrics after real traffic
(counts, the time-to-durable and time-in-queue histograms), structured JSON logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from evq.client import Client
from tests.integration.conftest import ServerFactory
from tests.integration.server import request

pytestmark = pytest.mark.integration

ADMIN = "admin-0123456789abcdef"
PRODUCER = "producer-0123456789abcdef"

TOKENS = f"""
[[token]]
name = "admin"
token = "{ADMIN}"
[token.queues]
"*" = "admin"

[[token]]
name = "producer"
token = "{PRODUCER}"
[token.queues]
"jobs-*" = "write"
"""


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_tokens_metrics_and_json_logs_on_a_real_server(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS)
    server = make_server(
        "--shards", "2", "--workers", "2", "--tokens-file", str(tokens), "--log-format", "json",
        "--auto-create",
    )  # fmt: skip
    url = server.url
    # Every gateway process enforces the tokens (new connections spread over both).
    for _ in range(6):
        assert request("GET", f"{url}/v1/queues")[0] == 401
        assert request("PUT", f"{url}/v1/queues/jobs-a", {}, headers=bearer(PRODUCER))[0] == 403
    assert request("PUT", f"{url}/v1/queues/jobs-a", {}, headers=bearer(ADMIN))[0] == 201
    assert request("PUT", f"{url}/v1/queues/other", {}, headers=bearer(ADMIN))[0] == 201
    with Client(url, token=PRODUCER, retries=0) as c:
        c.put("jobs-a", ["one", "two", "three"])
        taken = c.take("jobs-a", 2)
        c.ack("jobs-a", taken[0])
        assert c.list_queues() == ["jobs-a"]
        # --auto-create: a put creates its queue (a token that may write there suffices),
        # whichever gateway process the put reaches; a take of an unknown queue does not
        for i in range(4):
            with Client(url, token=PRODUCER, retries=0) as fresh:  # a new connection each
                fresh.put("jobs-auto", [f"made on first put {i}"])
        assert c.list_queues() == ["jobs-a", "jobs-auto"]
        stats = c.get_queue("jobs-auto").stats
        assert stats is not None
        assert stats.ready == 4
        status, doc = request(
            "POST", f"{url}/v1/queues/jobs-none/take", {}, headers=bearer(PRODUCER)
        )
        assert (status, doc["error"]["code"]) == (404, "QueueNotFound")
    body = {"messages": [{"body": "x"}]}
    status, doc = request("POST", f"{url}/v1/queues/other/messages", body, headers=bearer(PRODUCER))
    assert (status, doc["error"]["code"]) == (403, "Forbidden")

    assert request("GET", f"{url}/metrics")[0] == 401
    import urllib.request

    req = urllib.request.Request(f"{url}/metrics", headers=bearer(ADMIN))
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("evq_queue_messages", (("queue", "jobs-a"), ("state", "ready")))] == 1
    assert samples[("evq_queue_messages", (("queue", "jobs-a"), ("state", "reserved")))] == 1
    assert samples[("evq_queue_puts_total", (("queue", "jobs-a"),))] == 3
    assert samples[("evq_queue_acks_total", (("queue", "jobs-a"),))] == 1
    assert samples[("evq_queue_time_to_durable_seconds_count", (("queue", "jobs-a"),))] >= 3
    # time in queue: one message acked, so one observation, in every bucket from its own on
    in_queue = "evq_queue_time_in_queue_seconds"
    assert samples[(f"{in_queue}_count", (("queue", "jobs-a"),))] == 1
    assert 0 < samples[(f"{in_queue}_sum", (("queue", "jobs-a"),))] < 60
    assert samples[(f"{in_queue}_bucket", (("le", "+Inf"), ("queue", "jobs-a")))] == 1
    assert samples[(f"{in_queue}_count", (("queue", "jobs-auto"),))] == 0

    assert server.stop() == 0
    lines = [line for line in server.log(whole=True).splitlines() if line.startswith("{")]
    docs = [json.loads(line) for line in lines]
    assert any(d["logger"] == "evq.serve" and "auth on" in d["msg"] for d in docs)
    assert all({"ts", "level", "logger", "msg"} <= set(d) for d in docs)
