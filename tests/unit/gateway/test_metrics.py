"""/metrics after real traffic, parsed with prometheus-client's own parser."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.unit.gateway.conftest import Api


async def scrape(api: Api) -> dict[str, list[Any]]:
    async with api.client.get("/metrics") as resp:
        assert resp.status == 200
        assert resp.content_type == "text/plain"
        text = await resp.text()
    families: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        families.setdefault(family.name, []).extend(family.samples)
    return families


def value(families: dict[str, list[Any]], name: str, **labels: str) -> float:
    for samples in families.values():
        for sample in samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"no sample {name} {labels}")


async def test_metrics_after_real_traffic(api: Api) -> None:
    await api.create("m1", max_receives=5)
    await api.put("m1", "a", "b", "c", "d")
    taken = await api.take("m1", 3)
    await api.ack("m1", taken[0])
    await api.items("m1", "release", {"id": taken[1]["id"], "lease": taken[1]["lease"]})
    await api.call("GET", "/v1/queues/nope")  # a 404
    ws = await api.client.ws_connect("/v1/ws")
    await ws.send_json({"op": "watch", "key": "queue:m1"})
    await ws.receive(timeout=5)

    f = await scrape(api)
    assert value(f, "evq_queue_messages", queue="m1", state="ready") == 2
    assert value(f, "evq_queue_messages", queue="m1", state="reserved") == 1
    assert value(f, "evq_queue_messages", queue="m1", state="delayed") == 0
    assert value(f, "evq_queue_puts_total", queue="m1") == 4
    assert value(f, "evq_queue_takes_total", queue="m1") == 3
    assert value(f, "evq_queue_acks_total", queue="m1") == 1
    assert value(f, "evq_queue_releases_total", queue="m1") == 1
    assert value(f, "evq_queue_dead_letters_total", queue="m1") == 0
    assert value(f, "evq_queue_receive_count_count", queue="m1") == 3
    assert value(f, "evq_queue_receive_count_bucket", queue="m1", le="1") == 3
    assert value(f, "evq_queue_time_to_durable_seconds_count", queue="m1") >= 4
    assert value(f, "evq_queue_log_bytes", queue="m1") > 0
    assert value(f, "evq_queue_log_segments", queue="m1") >= 4
    assert value(f, "evq_queue_recovery_seconds", queue="m1") >= 0
    assert value(f, "evq_queue_oldest_ready_age_seconds", queue="m1") >= 0
    put_route = "/v1/queues/{name}/messages"
    assert value(f, "evq_http_requests_total", route=put_route, method="POST", status="200") == 1
    assert value(f, "evq_http_requests_total", route="/v1/queues/{name}", status="404") == 1
    assert value(f, "evq_http_request_duration_seconds_count", route=put_route) == 1
    assert value(f, "evq_watchers", kind="websocket") == 1
    assert value(f, "evq_watch_upstream_keys") == 1
    assert value(f, "evq_shard_calls_total") >= 5
    assert value(f, "evq_shard_call_commands_count") >= 5
    assert value(f, "evq_log_records_dropped_total") >= 0
    assert not any(s.labels.get("queue", "").startswith("__evq") for s in f["evq_queue_messages"])
    await ws.close()


async def test_shard_log_figures_count_commits_records_and_bytes(api: Api) -> None:
    await api.create("w1")
    before = await scrape(api)
    commits = sum(s.value for s in before["evq_shard_log_commits"])
    records = sum(s.value for s in before["evq_shard_log_records"])
    written = sum(s.value for s in before["evq_shard_log_bytes"])
    for body in ("a", "b", "c"):
        await api.put("w1", body)  # one at a time: a commit each

    after = await scrape(api)
    shards = {s.labels["shard"] for s in after["evq_shard_log_commits"]}
    assert shards
    assert shards == {str(i) for i in range(len(shards))}
    assert sum(s.value for s in after["evq_shard_log_commits"]) >= commits + 3
    assert sum(s.value for s in after["evq_shard_log_records"]) >= records + 3
    assert sum(s.value for s in after["evq_shard_log_bytes"]) > written + 3
    assert all(s.value >= 1 for s in after["evq_shard_log_segments"])
