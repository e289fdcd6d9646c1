"""Shards that belong to the Ray cluster, not to a gateway (issue 17).

A Ray head runs on its own (``ray start --head`` on 127.0.0.2, in a session of its own), and
``evq serve --ray-address`` gateways join it with the cluster's secret
(``EVQ_CLUSTER_SECRET``). The first gateway creates the shards, detached; a gateway that is
SIGKILLed or stopped leaves them running, and the next one attaches to the same processes
and serves every message the first one acknowledged. A gateway with another secret, or
none, is refused with a clear error. ``evq shards status|stop`` lists and ends them.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from evq.client import Client, RetryPolicy
from tests.integration.server import EVQ, ROOT, Server, eventually, free_port, request
from tests.integration.test_two_node import HEAD_IP, RayNode, cluster_env, ray_status

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SHARDS = 2
MESSAGES = 20


class Head:
    """A one-node Ray cluster in a temp dir of its own (its node's environment: ``env``,
    else ``cluster_env()``)."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        # Short: Ray puts Unix sockets under it (a socket path holds at most 107 bytes).
        self.root = Path(tempfile.mkdtemp(prefix="evqsh-", dir="/tmp"))
        port = free_port()
        self.address = f"{HEAD_IP}:{port}"
        self.node = RayNode(
            "head",
            [
                "--head",
                *("--port", str(port), "--node-ip-address", HEAD_IP, "--num-cpus", "1"),
                *("--include-dashboard", "false", "--temp-dir", str(self.root)),
            ],
            self.root / "head.log",
            env=env,
        )

    def up(self) -> bool:
        if self.node.proc is None or self.node.proc.poll() is not None:
            raise RuntimeError(f"ray start exited:\n{self.node.log()}")
        return ray_status(self.address).count(" node_") == 1

    def gateway(self, name: str, env: dict[str, str] | None = None) -> Server:
        """An ``evq serve`` joining this cluster (not started)."""
        return Server(
            self.root / "data",
            *("--ray-address", self.address, "--shards", str(SHARDS)),
            env=env or cluster_env(),
            log=self.root / f"{name}.log",
        )

    def shards(self, action: str = "status") -> list[dict]:
        """``evq shards ACTION`` against this cluster: its JSON lines."""
        done = subprocess.run(
            [*EVQ, "shards", action, "--ray-address", self.address],
            cwd=ROOT,
            env=cluster_env(),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]

    def shard_pids(self) -> dict[int, int]:
        """Running shards: index -> pid."""
        return {doc["shard"]: doc["pid"] for doc in self.shards()}


@contextlib.contextmanager
def running(env: dict[str, str] | None = None) -> Iterator[Head]:
    h = Head(env)
    try:
        h.node.start()
        eventually(h.up, timeout=120, interval=1.0, what="a one-node Ray cluster")
        yield h
    finally:
        h.node.kill()
        shutil.rmtree(h.root, ignore_errors=True)


@pytest.fixture
def head() -> Iterator[Head]:
    with running() as h:
        yield h


ASK_SHARD = """
import sys, ray
ray.init(address=sys.argv[1], namespace="evq", logging_level="ERROR")
print(repr(ray.get(ray.get_actor("evq-shard-0").channel_access.remote())))
"""


def test_the_secret_does_not_travel_through_ray(head: Head) -> None:
    """In a cluster the gateway gives the shards no secret (Ray's traffic between nodes is
    not encrypted): each shard reads its node's, and what a shard tells other members of
    the cluster (channel_access, for handlers) does not carry it either."""
    gateway = head.gateway("g").start(ready_timeout=120)
    try:
        assert request("PUT", f"{gateway.url}/v1/queues/jobs", {})[0] in (200, 201)
        status, doc = request(
            "POST", f"{gateway.url}/v1/queues/jobs/messages", {"messages": [{"body": "x"}]}
        )
        assert status == 200, doc  # the channel works: both ends hold the node's secret
        asked = subprocess.run(
            [sys.executable, "-c", ASK_SHARD, head.address],
            env=cluster_env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert asked.returncode == 0, asked.stderr[-3000:]
        assert asked.stdout.strip().splitlines()[-1] == f"({SHARDS}, None)"
    finally:
        _stop(gateway)


def test_a_shard_node_without_the_secret_is_named_when_a_gateway_starts() -> None:
    bare = {k: v for k, v in cluster_env().items() if k != "EVQ_CLUSTER_SECRET"}
    with running(bare) as h:
        gateway = h.gateway("g")
        with pytest.raises(RuntimeError, match="has no cluster secret"):
            gateway.start(ready_timeout=120)
        _stop(gateway)


def _stop(server: Server) -> None:
    if server.proc is not None and server.running():
        server.kill()


def test_the_shards_outlive_their_gateways_and_only_the_cluster_secret_opens_them(
    head: Head,
) -> None:
    first = head.gateway("first").start(ready_timeout=120)
    second = head.gateway("second")
    try:
        assert request("PUT", f"{first.url}/v1/queues/jobs", {})[0] in (200, 201)
        for i in range(MESSAGES):
            status, doc = request(
                "POST", f"{first.url}/v1/queues/jobs/messages", {"messages": [{"body": f"m{i}"}]}
            )
            assert status == 200, doc
        pids = head.shard_pids()
        assert sorted(pids) == list(range(SHARDS))

        first.kill()  # SIGKILL: no goodbye to the shards
        assert head.shard_pids() == pids, "the shards died with the gateway"

        second.start(ready_timeout=120)
        status, doc = request(
            "POST", f"{second.url}/v1/queues/jobs/take", {"max": 100, "visibility_timeout": 60}
        )
        assert status == 200, doc
        assert sorted(m["body"] for m in doc["messages"]) == sorted(
            f"m{i}" for i in range(MESSAGES)
        )
        assert head.shard_pids() == pids, "the shards restarted"

        wrong = head.gateway("wrong", {**cluster_env(), "EVQ_CLUSTER_SECRET": "x" * 32})
        with pytest.raises(RuntimeError, match="holds another cluster secret"):
            wrong.start(ready_timeout=120)
        unset = {k: v for k, v in cluster_env().items() if k != "EVQ_CLUSTER_SECRET"}
        with pytest.raises(RuntimeError, match="needs the cluster's secret"):
            head.gateway("unset", unset).start(ready_timeout=120)
        short = head.gateway("short", {**cluster_env(), "EVQ_CLUSTER_SECRET": "short"})
        with pytest.raises(RuntimeError, match="at least 16 characters"):
            short.start(ready_timeout=120)

        second.stop(timeout=45)  # SIGTERM: it lets go of the shards, does not close them
        assert head.shard_pids() == pids

        stopped = head.shards("stop")
        assert sorted(doc["shard"] for doc in stopped if doc["stopped"]) == list(range(SHARDS))
        assert head.shard_pids() == {}
    finally:
        _stop(first)
        _stop(second)


def test_every_gateway_of_the_cluster_serves_every_queue_wait_and_watch(head: Head) -> None:
    """Two gateways on the same shards: a take waiting on one is answered by a put through
    the other, a watcher on one sees a key set through the other, and each one's /metrics,
    queue list and shard status (what the dashboard shows) cover the queues made through the
    other."""
    a = head.gateway("a").start(ready_timeout=120)
    b = head.gateway("b")
    try:
        b.start(ready_timeout=120)
        assert request("PUT", f"{b.url}/v1/queues/made-on-b", {})[0] in (200, 201)
        assert request("PUT", f"{a.url}/v1/queues/made-on-a", {})[0] in (200, 201)
        for gw in (a, b):
            status, doc = request("GET", f"{gw.url}/v1/queues")
            assert status == 200, doc
            names = {q["name"] if isinstance(q, dict) else q for q in doc["queues"]}
            assert {"made-on-a", "made-on-b"} <= names, (gw.url, doc)
            with urllib.request.urlopen(f"{gw.url}/metrics", timeout=10) as r:
                text = r.read().decode()
            assert 'queue="made-on-a"' in text
            assert 'queue="made-on-b"' in text
            # The dashboard's other source: every shard's status, from either gateway.
            status, doc = request("GET", f"{gw.url}/v1/status")
            assert status == 200, doc
            assert sorted(s["index"] for s in doc["shards"]) == list(range(SHARDS))
            assert sum(s["queues"] for s in doc["shards"]) >= 2

        with ThreadPoolExecutor(2) as pool:
            waiting = pool.submit(
                request, "POST", f"{a.url}/v1/queues/made-on-b/take", {"max": 1, "wait": 20}, 30
            )
            status, doc = request("PUT", f"{b.url}/v1/keys/k", {"value": 1})
            assert status == 200, doc
            version = doc["version"]
            watching = pool.submit(
                request, "GET", f"{a.url}/v1/watch/k?version={version}&timeout=20", None, 30
            )
            time.sleep(1.0)  # both are waiting on gateway a now
            assert not waiting.done()
            assert not watching.done()
            put = request(
                "POST", f"{b.url}/v1/queues/made-on-b/messages", {"messages": [{"body": "x"}]}
            )
            assert put[0] == 200, put
            status, doc = request("PUT", f"{b.url}/v1/keys/k", {"value": 2})
            assert status == 200, doc
            status, taken = waiting.result(timeout=15)
            assert status == 200, taken
            assert [m["body"] for m in taken["messages"]] == ["x"]
            status, seen = watching.result(timeout=15)
            assert status == 200, seen
            assert seen["value"] == 2
            assert seen["version"] > version

        # A resize asked of one gateway is shown by the other (the task board in the
        # store), which refuses a second change of the shards while it runs.
        status, doc = request("POST", f"{a.url}/v1/admin/shards", {"count": 3})
        assert status == 202, doc
        task = doc["task"]
        shown = eventually(
            lambda: (v := request("GET", f"{b.url}/v1/tasks/{task}"))[0] == 200 and v[1],
            timeout=10,
        )
        assert isinstance(shown, dict)
        assert (shown["kind"], shown["count"]) == ("resize", 3)
        status, doc = request("POST", f"{b.url}/v1/admin/shards/restart", None)
        if status == 202:  # only if the resize ended first
            assert request("GET", f"{a.url}/v1/tasks/{task}")[1]["state"] == "done"
        else:
            assert (status, doc["error"]["code"]) == (409, "Conflict"), doc
        done = eventually(
            lambda: request("GET", f"{b.url}/v1/tasks/{task}")[1]["state"] == "done",
            timeout=120,
        )
        assert done
        assert task in [t["id"] for t in request("GET", f"{b.url}/v1/tasks")[1]["tasks"]]
        assert request("GET", f"{b.url}/v1/admin/shards")[1]["count"] == 3
    finally:
        _stop(a)
        _stop(b)
        head.shards("stop")


def test_a_client_of_two_gateways_carries_on_when_one_is_killed(
    head: Head, record_property: pytest.RecordProperty
) -> None:
    """A producer with both gateways' URLs keeps putting while one gateway is SIGKILLed: no
    put fails (a put is resent with its idempotency keys), none is lost or doubled. The
    longest wait for a put across the kill is printed (``failover_s``)."""
    a = head.gateway("a").start(ready_timeout=120)
    b = head.gateway("b")
    client = Client(
        [a.url, b.url], timeout=5.0, retries=RetryPolicy(retries=8, backoff=0.05, max_backoff=1)
    )
    try:
        b.start(ready_timeout=120)
        client.create_queue("jobs")
        acked: list[str] = []
        slowest = 0.0
        for i in range(300):
            if i == 100:
                a.kill()
            started = time.monotonic()
            [result] = client.put("jobs", f"m{i}")
            slowest = max(slowest, time.monotonic() - started)
            assert result.status == "created"
            acked.append(f"m{i}")
        assert client.base_url == b.url
        bodies: list[str] = []
        while batch := client.take("jobs", 1000, visibility_timeout=60):
            bodies += [m.body.decode() for m in batch]
        assert sorted(bodies) == sorted(acked)
        print(f"failover_s={slowest:.3f}")
        record_property("failover_s", round(slowest, 3))
    finally:
        client.close()
        _stop(a)
        _stop(b)
        head.shards("stop")
