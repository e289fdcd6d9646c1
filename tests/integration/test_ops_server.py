"""Operations against a real ``evq serve`` with Ray and two gateway processes: tokens from
a file on every process, /metrics after real traffic, structured JSON logs."""

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
        "--shards", "2", "--workers", "2", "--tokens-file", str(tokens), "--log-format", "json"
    )
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

    assert server.stop() == 0
    lines = [line for line in server.log(whole=True).splitlines() if line.startswith("{")]
    docs = [json.loads(line) for line in lines]
    assert any(d["logger"] == "evq.serve" and "auth on" in d["msg"] for d in docs)
    assert all({"ts", "level", "logger", "msg"} <= set(d) for d in docs)
