"""Resizing a running ``evq serve`` (shards on a real local Ray) with ``evq shards resize``
while it works (issue 34): 1 → 4 → 2 under 64 producers, 16 consumers that take and ack,
long-poll takes and 1,000 WebSocket watches. Nothing acknowledged is lost, no acked message
comes back, every watcher ends at its key's final version, every queue ends on the shard
the map names, and a restart serves the new count."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from actors.log.placement import placement
from evq.client import Client
from tests.integration.conftest import Names, ServerFactory
from tests.integration.resize_load import (
    QUEUES,
    check_load,
    cli,
    drain,
    light_load,
    resize_under_load,
)
from tests.integration.server import Server, cmdline

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]


def test_a_served_store_grows_and_shrinks_under_load_and_loses_nothing(
    make_server: ServerFactory, names: Names
) -> None:
    server = make_server("--shards", "1")
    queues = [names(f"rz{i}") for i in range(QUEUES)]
    with Client(server.url, retries=0, timeout=30) as c:
        for queue in queues:
            c.create_queue(queue)

    load = asyncio.run(resize_under_load(server, queues))
    check_load(server, queues, load, count=2)
    with Client(server.url, retries=0, timeout=30) as c:
        assert "task" not in c.shards()
        listed = cli(server, "--json", "tasks")
        tasks = json.loads(listed.stdout)["tasks"]
        assert [(t["kind"], t["state"], t["count"]) for t in tasks] == [
            ("resize", "done", 4),
            ("resize", "done", 2),
        ]
        assert all(t["done"] == t["total"] > 0 for t in tasks)

    assert server.stop() == 0
    server.args = [a for a in server.args if a not in ("--shards", "1")]
    server.start()  # the store's count now: 2
    with Client(server.url, retries=0, timeout=30) as c:
        assert c.shards()["count"] == 2
        c.put(queues[3], "after the restart")
        assert [m.body for m in c.take(queues[3], 5)] == [b"after the restart"]


def test_a_rolling_restart_gives_every_shard_a_new_process_and_fails_no_operation(
    make_server: ServerFactory, names: Names
) -> None:
    server = make_server("--shards", "2")
    queues = [names(f"rr{i}") for i in range(8)]
    with Client(server.url, retries=0, timeout=30) as c:
        for queue in queues:
            c.create_queue(queue)
        c.put(queues[0], "held")
        [held] = c.take(queues[0], 1, visibility_timeout=600)
    before = server.shard_pids()
    assert sorted(before) == [0, 1]

    def restart() -> None:
        done = cli(server, "shards", "restart", "--wait")
        assert done.returncode == 0, done.stderr
        assert "restart  done  2/2" in done.stdout
        assert "2/2 shard(s) restarted" in done.stderr

    load = asyncio.run(light_load(server, queues, restart))
    assert not load.errors, load.errors[:20]
    assert len(load.put) > 100
    assert max(load.acked.values()) == 1
    after = server.shard_pids()
    assert sorted(after) == [0, 1]
    assert not set(after.values()) & set(before.values())  # every shard a new process
    with Client(server.url, retries=0, timeout=30) as c:
        assert c.ack(queues[0], held)[0].status == "ok"  # its lease outlived two handovers
        shards = c.shards()
        assert (shards["count"], len(shards["shards"])) == (2, 2)
        for queue in queues:
            assert queue in shards["shards"][placement(queue, 2)]["queues"], queue
        left = drain(c, queues)
    assert set(left) | set(load.acked) == load.put
    assert not set(left) & set(load.acked)


def _fresh(server: Server, method: str, path: str, doc: Any = None) -> tuple[int, Any]:
    """One request on a connection of its own (the kernel picks the gateway process)."""
    import urllib.error
    import urllib.request

    data = None if doc is None else json.dumps(doc).encode()
    request = urllib.request.Request(
        server.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_every_gateway_process_answers_for_the_tasks_the_main_one_runs(
    make_server: ServerFactory, names: Names
) -> None:
    """With --workers 2, a resize asked of either process runs in the main one, and every
    process shows it and its progress (requests on fresh connections land on both)."""
    server = make_server("--shards", "1", "--workers", "2")
    queues = [names(f"wk{i}") for i in range(6)]
    with Client(server.url, retries=0, timeout=30) as c:
        for queue in queues:
            c.create_queue(queue)
    status, doc = _fresh(server, "POST", "/v1/admin/shards", {"count": 2})
    assert status == 202, doc
    task = doc["task"]
    for _ in range(300):
        views = [_fresh(server, "GET", f"/v1/tasks/{task}") for _ in range(4)]
        assert {s for s, _ in views} == {200}, views
        if all(v["state"] == "done" for _, v in views):
            break
        time.sleep(0.1)
    listed = {json.dumps(_fresh(server, "GET", "/v1/tasks")[1], sort_keys=True) for _ in range(6)}
    assert len(listed) == 1  # the same list from every process
    busy = [_fresh(server, "POST", "/v1/admin/shards", {"count": 3}) for _ in range(2)]
    assert busy[0][0] == 202
    assert busy[1][0] in (202, 409)  # the second lands on the running one, or after it
    pids = {p for p in server.pids() if "gateway.workers" in cmdline(p)}
    assert len(pids) == 1  # the worker process took part
    # every process lists the same gateways (the cluster page's): this server, 2 processes
    listed = set()
    for _ in range(6):
        status, doc = _fresh(server, "GET", "/v1/status")
        assert status == 200, doc
        listed.add(tuple((g["id"], g["listen"], g["processes"]) for g in doc["gateways"]))
    [[(_, listen, processes)]] = listed
    assert (listen, processes) == (server.url, 2)
    # a queue's history, from its shard over the channel (a queue moved since starts it
    # again; a commit notes the counts at most every 5 s)
    with Client(server.url, retries=0, timeout=30) as c:
        c.put(queues[0], "x")
        *minutes, now = c.queue_history(queues[0])
        assert (now["ready"], now["enqueued"], now["acked"]) == (1, 1, 0)
        assert minutes, "no commit noted a sample"
        assert minutes[-1]["enqueued"] in (0, 1)
    with Client(server.url, retries=0, timeout=30) as c:
        for _ in range(300):
            if c.shards()["count"] == 3 and c.tasks()[-1]["state"] != "running":
                break
            time.sleep(0.1)
        shards = c.shards()
        assert shards["count"] == 3
        for queue in queues:
            assert queue in shards["shards"][placement(queue, 3)]["queues"]
