"""The dashboard's routes over real HTTP (no browser): the page and its files, and
``GET /v1/status`` (shards, readiness, recovery reports). The page itself runs in headless
Chromium in tests/integration/test_dashboard_browser.py."""

from __future__ import annotations

import os
import re
import tomllib
from fnmatch import fnmatch
from importlib import resources
from pathlib import Path

import msgspec
import pytest

from actors.log.store import LocalDirStore
from actors.shard import placement
from actors.status import Discarded, RecoveryReport, ShardStatus
from gateway import dashboard
from tests.unit.gateway.conftest import Api, GatedStore, Serve

ROOT = Path(__file__).resolve().parents[3]


def referenced(html: str) -> list[str]:
    """The page's own files that index.html loads (src= and href=, relative)."""
    return re.findall(r'(?:src|href)="dashboard/([^"]+)"', html)


async def test_the_page_and_every_file_it_loads_are_served(api: Api) -> None:
    reply = await api.call("GET", "/")
    assert reply.status == 200, reply
    assert reply.headers["Content-Type"] == "text/html; charset=utf-8"
    assert reply.headers["Cache-Control"] == "no-cache"
    files = referenced(reply.doc)
    assert sorted(files) == ["app.js", "chart.js", "console.js", "style.css"]
    for name in files:
        reply = await api.call("GET", f"/dashboard/{name}")
        assert reply.status == 200, (name, reply)
        kind = "text/css" if name.endswith(".css") else "text/javascript"
        assert reply.headers["Content-Type"] == f"{kind}; charset=utf-8", name
        assert reply.doc == (resources.files(dashboard) / name).read_text(), name


@pytest.mark.parametrize(
    "path",
    [
        "/dashboard/nothing.js",
        "/dashboard/index.html",  # the page lives at / (its relative links assume so)
        "/dashboard/__init__.py",
        "/dashboard/README.md",
        "/dashboard/..%2F__init__.py",
        "/dashboard/",
    ],
)
async def test_nothing_else_is_served_under_dashboard(api: Api, path: str) -> None:
    reply = await api.call("GET", path)
    assert reply.status == 404, reply
    assert reply.code, reply  # the API's error body


async def test_the_page_does_not_shadow_the_sqs_api_on_post_slash(api: Api) -> None:
    await api.create("orders")
    reply = await api.client.post(
        "/",
        data=b"{}",
        headers={
            "X-Amz-Target": "AmazonSQS.ListQueues",
            "Content-Type": "application/x-amz-json-1.0",
        },
    )
    async with reply:
        assert reply.status == 200, await reply.text()
        urls = (await reply.json(content_type=None))["QueueUrls"]
    assert [u.rsplit("/", 1)[1] for u in urls] == ["orders"]


def test_package_data_ships_every_file_of_the_page() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data = pyproject["tool"]["setuptools"]["package-data"]
    globs = data.get("gateway.dashboard", []) + data.get("*", [])
    for name in dashboard.FILES:
        assert (resources.files(dashboard) / name).is_file(), name
        assert any(fnmatch(name, g) for g in globs), f"{name} is not package data"


async def test_status_of_a_ready_server_lists_each_shard(api: Api) -> None:
    await api.create("orders")
    doc = await api.ok("GET", "/v1/status")
    assert doc["ready"] is True
    assert [s["index"] for s in doc["shards"]] == [0, 1]
    assert all(s["ready"] and s["recovering"] == 0 and s["failed"] == {} for s in doc["shards"])
    assert sum(s["queues"] for s in doc["shards"]) == 1
    (report,) = [r for s in doc["shards"] for r in s["reports"]]
    assert report["queue"] == "orders"
    assert report["clean"] is True
    assert report["last_seq"] == 0  # created here: nothing to recover
    # shards in this process: the gateway lists itself alone (gateway/presence.py)
    [gateway] = doc["gateways"]
    assert (gateway["self"], gateway["pid"], gateway["processes"]) == (True, os.getpid(), 1)
    assert gateway["last_seen_s"] == 0.0


async def test_status_after_a_restart_reports_what_recovery_used_and_discarded(
    serve: Serve, data_dir: Path
) -> None:
    first = await serve()
    await first.create("orders")
    await first.put("orders", "a", "b", "c")
    await first.create("emails")
    await first.client.close()
    shard = placement("orders", 2)
    torn = f"wal/{shard:04d}/{10**9:020d}.seg"  # far past the log's end: a gap before it
    (data_dir / torn).write_bytes(b"torn")
    api = await serve()
    doc = await api.ok("GET", "/v1/status")
    reports = {r["queue"]: r for s in doc["shards"] for r in s["reports"]}
    assert set(reports) == {"orders", "emails"}
    orders = reports["orders"]
    assert orders["epoch"] == 2
    assert orders["snapshot"] == f"queues/orders/snap/{orders['snapshot_seq']:020d}.snap"
    assert orders["last_seq"] >= orders["snapshot_seq"] > 0
    assert orders["clean"] is True
    log = doc["shards"][shard]["log"]
    assert log["epoch"] == 2
    assert log["segments"] >= 2  # the shard's own, and the torn one
    (discarded,) = log["discarded"]
    assert discarded["object"] == torn
    assert discarded["offset"] == 0
    assert "gap" in discarded["reason"]
    assert (data_dir / "wal" / f"{shard:04d}" / "damaged" / f"{10**9:020d}.seg.2").read_bytes() == (
        b"torn"
    )
    assert not (data_dir / torn).exists()
    assert reports["emails"]["clean"] is True
    assert reports["emails"]["discarded"] == []
    assert (await api.stats("orders"))["ready"] == 3


async def test_status_answers_while_recovering_and_in_msgpack(serve: Serve, data_dir: Path) -> None:
    first = await serve()
    await first.create("orders")
    await first.client.close()
    store = GatedStore(LocalDirStore(data_dir))
    store.hold("list")  # recovery starts by listing the store's queues
    api = await serve(store=store, ready=False)
    reply = await api.call("GET", "/v1/status", accept="application/msgpack")
    assert reply.status == 200, reply
    assert reply.headers["Content-Type"] == "application/msgpack"
    assert reply.doc["ready"] is False
    assert [s["ready"] for s in reply.doc["shards"]] == [False, False]
    store.release("list")
    await api.wait_ready()
    assert (await api.ok("GET", "/v1/status"))["ready"] is True


def test_status_doc_of_reports_with_and_without_damage() -> None:
    damaged = RecoveryReport(
        queue="q",
        epoch=3,
        snapshot="queues/q/snap/00000000000000000010.snap",
        snapshot_seq=10,
        segments_replayed=2,
        records_replayed=7,
        last_seq=17,
        discarded=[Discarded("queues/q/log/00000000000000000018.seg", 120, 4, "bad crc")],
        duration_ms=5,
    )
    statuses = [
        ShardStatus(0, True, 1, 0, [damaged], {}),
        ShardStatus(1, False, 2, 1, [RecoveryReport(queue="p")], {"r": "store unreachable"}),
    ]
    doc = dashboard.status_doc(statuses)
    assert doc["ready"] is False
    assert doc["shards"][0]["reports"] == [
        {
            "queue": "q",
            "epoch": 3,
            "snapshot": "queues/q/snap/00000000000000000010.snap",
            "snapshot_seq": 10,
            "segments_replayed": 2,
            "records_replayed": 7,
            "last_seq": 17,
            "discarded": [
                {
                    "object": "queues/q/log/00000000000000000018.seg",
                    "offset": 120,
                    "records": 4,
                    "reason": "bad crc",
                }
            ],
            "duration_ms": 5,
            "clean": False,
        }
    ]
    second = doc["shards"][1]
    assert (second["ready"], second["queues"], second["recovering"]) == (False, 2, 1)
    assert second["failed"] == {"r": "store unreachable"}
    assert second["reports"][0]["clean"] is True
    assert msgspec.json.decode(msgspec.json.encode(doc)) == doc  # plain JSON all the way
    assert dashboard.status_doc([])["ready"] is False  # no shards: nothing is ready


async def test_a_queue_s_history_is_its_counts_a_minute_and_now(api: Api) -> None:
    await api.create("orders")
    await api.put("orders", "a", "b", "c")
    doc = await api.ok("GET", "/v1/queues/orders/history")
    assert doc["minute_s"] == 60
    *minutes, now = doc["samples"]
    assert (now["ready"], now["delayed"], now["reserved"]) == (3, 0, 0)
    assert (now["enqueued"], now["acked"]) == (3, 0)
    # a sample a minute (two if one began meanwhile), each the counts after a commit
    assert 1 <= len(minutes) <= 2, minutes
    assert all((m["ready"], m["enqueued"]) in {(0, 0), (3, 3)} for m in minutes), minutes
    assert all(m["at"] <= now["at"] for m in minutes)
    reply = await api.call("GET", "/v1/queues/nope/history")
    assert reply.status == 404, reply
    assert reply.doc["error"]["code"] == "QueueNotFound"
