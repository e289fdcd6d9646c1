"""/metrics after real traffic, parsed with prometheus-client's own parser; the figures
that depend on time or on failures checked against scenarios that set them: a clock moved
by hand (oldest ready age, time in queue), a recovery held for a known time, a log sink
that is stuck (dropped records)."""

from __future__ import annotations

import asyncio
import io
import logging
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from actors.clock import ManualClock
from actors.directory import LocalDirectory
from actors.log.store import LocalDirStore
from actors.shard import placement
from gateway import logs
from gateway.app import AppOptions, make_app
from tests.unit.gateway.conftest import Api, DoorTestServer, GatedStore, Serve


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


async def test_metrics_after_real_traffic(serve: Serve) -> None:
    started = time.perf_counter()
    api = await serve()
    await api.create("m1", max_receives=5)
    put_at = time.time()
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
    shard = str(placement("m1", 2))  # the fixture's directory has two shards
    recovery = value(f, "evq_shard_recovery_seconds", shard=shard)
    assert value(f, "evq_queue_recovery_seconds", queue="m1") == recovery
    assert 0 <= recovery <= time.perf_counter() - started
    assert 0 <= value(f, "evq_queue_oldest_ready_age_seconds", queue="m1") <= time.time() - put_at
    assert value(f, "evq_queue_time_in_queue_seconds_count", queue="m1") == 1  # one ack
    assert value(f, "evq_queue_spilled_messages", queue="m1") == 0  # a put of 4: objects
    put_route = "/v1/queues/{name}/messages"
    assert value(f, "evq_http_requests_total", route=put_route, method="POST", status="200") == 1
    assert value(f, "evq_http_requests_total", route="/v1/queues/{name}", status="404") == 1
    assert value(f, "evq_http_request_duration_seconds_count", route=put_route) == 1
    assert value(f, "evq_watchers", kind="websocket") == 1
    assert value(f, "evq_watch_upstream_keys") == 1
    assert value(f, "evq_shard_calls_total") >= 5
    assert value(f, "evq_shard_call_commands_count") >= 5
    assert value(f, "evq_log_records_dropped_total") == logs.dropped()
    assert not any(s.labels.get("queue", "").startswith("__evq") for s in f["evq_queue_messages"])
    await ws.close()


async def test_messages_held_in_runs_are_counted_apart(api: Api) -> None:
    await api.create("spill")
    await api.put("spill", *[{"body": f"d{i}", "delay": 3600 + i} for i in range(20)])
    await api.put("spill", *[f"r{i}" for i in range(30)])
    await api.put("spill", {"body": "a", "attributes": {"k": "v"}})
    f = await scrape(api)
    assert value(f, "evq_queue_messages", queue="spill", state="delayed") == 20
    assert value(f, "evq_queue_messages", queue="spill", state="ready") == 31
    assert (
        value(f, "evq_queue_spilled_messages", queue="spill") == 50
    )  # not the one with attributes
    await api.take("spill", 5)
    f = await scrape(api)
    assert value(f, "evq_queue_spilled_messages", queue="spill") == 45


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


# ---------------------------------------------------------------- figures set by a scenario

T0 = 1_700_000_000_000


@pytest.fixture
async def manual(aiohttp_client: Any, data_dir: Path) -> AsyncIterator[tuple[Api, ManualClock]]:
    """A gateway over one in-process shard whose clock the test moves by hand."""
    clock = ManualClock(T0)
    directory = LocalDirectory(LocalDirStore(data_dir), count=1, clock=clock)
    client = await aiohttp_client(DoorTestServer(make_app(directory, AppOptions())))
    api = Api(client)
    await api.wait_ready()
    yield api, clock
    api.raw.close()


async def test_oldest_ready_age_and_time_in_queue_follow_the_clock(
    manual: tuple[Api, ManualClock],
) -> None:
    api, clock = manual
    await api.create("q", visibility_timeout=600)
    await api.put("q", "a")
    clock.advance(5_000)
    f = await scrape(api)
    assert value(f, "evq_queue_oldest_ready_age_seconds", queue="q") == 5.0
    assert value(f, "evq_queue_time_in_queue_seconds_count", queue="q") == 0

    [a] = await api.take("q")
    clock.advance(2_000)
    assert await api.ack("q", a) == ["ok"]  # 7 s after its put
    await api.put("q", "b")
    [b] = await api.take("q")
    clock.advance(30)
    assert await api.ack("q", b) == ["ok"]  # 30 ms
    await api.put("q", "c")
    [c] = await api.take("q")
    await api.items("q", "release", {"id": c["id"], "lease": c["lease"]})
    await api.call("DELETE", f"/v1/queues/q/messages/{c['id']}")  # gone, but not acked
    f = await scrape(api)
    histogram = {
        s.labels["le"]: s.value
        for s in f["evq_queue_time_in_queue_seconds"]
        if s.name.endswith("_bucket") and s.labels["queue"] == "q"
    }
    assert (histogram["0.01"], histogram["0.05"], histogram["5"], histogram["15"]) == (0, 1, 1, 2)
    assert histogram["+Inf"] == 2
    assert value(f, "evq_queue_time_in_queue_seconds_count", queue="q") == 2
    assert value(f, "evq_queue_time_in_queue_seconds_sum", queue="q") == pytest.approx(7.03)
    ages = f.get("evq_queue_oldest_ready_age_seconds", [])
    assert not [s for s in ages if s.labels["queue"] == "q"]  # nothing ready: no age


async def test_recovery_seconds_is_how_long_the_shard_took_to_read_its_log(
    serve: Serve, data_dir: Path
) -> None:
    first = await serve()
    await first.create("q")
    for _ in range(10):
        await first.put("q", *[f"m{i}" for i in range(100)])  # a log of 10 puts, 1000 messages
    await first.client.close()

    store = GatedStore(LocalDirStore(data_dir))
    store.hold("list")  # recovery starts by listing the store's queues
    started = time.perf_counter()
    api = await serve(store=store, ready=False)
    await asyncio.sleep(0.3)
    store.release("list")
    await api.wait_ready()
    elapsed = time.perf_counter() - started

    f = await scrape(api)
    assert (await api.stats("q"))["ready"] == 1000
    shard = str(placement("q", 2))
    recovery = value(f, "evq_shard_recovery_seconds", shard=shard)
    assert 0.3 <= recovery <= elapsed
    assert value(f, "evq_queue_recovery_seconds", queue="q") == recovery
    other = value(f, "evq_shard_recovery_seconds", shard=str(1 - int(shard)))
    assert 0.3 <= other <= elapsed  # held too: every shard lists the store first


class StuckSink(io.StringIO):
    """A log sink whose writes wait until ``gate`` opens; ``entered`` tells that the writer
    thread is stuck in one."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()

    def write(self, s: str) -> int:
        self.entered.set()
        self.gate.wait(30)
        return super().write(s)


async def test_dropped_log_records_count_what_a_stuck_sink_dropped(api: Api) -> None:
    before = value(await scrape(api), "evq_log_records_dropped_total")
    sink = StuckSink()
    handler = logs.NonBlockingHandler(sink, capacity=10)
    logger = logging.getLogger("evq.test.stuck_sink")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("first")  # the writer takes it and gets stuck writing it
        assert await asyncio.to_thread(sink.entered.wait, 5)
        for i in range(100):
            logger.warning("record %d", i)  # 10 wait in the queue, 90 are dropped
        sink.gate.set()
        after = value(await scrape(api), "evq_log_records_dropped_total")
    finally:
        sink.gate.set()
        logger.removeHandler(handler)
        handler.close()
    assert after - before == 90
