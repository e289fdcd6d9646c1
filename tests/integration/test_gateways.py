"""Two gateways in front of shards spread over a two-node Ray cluster (issue 17).

The cluster is the one of ``test_two_node``: a head on 127.0.0.2 and a second node on
127.0.0.3, both offering ``evq_shard``. Two ``evq serve --ray-address …`` gateways, one on
127.0.0.2 and one on 127.0.0.3 (each its own port), start at the same moment: one of them
creates the four shards (spread over both nodes), the other attaches to them.

Producers, consumers and watchers use clients that know both gateways, half of them the one
first and half the other. Then:

- one gateway is SIGKILLed in the middle of a put storm: its clients go on through the
  other, no acknowledged put is lost or doubled, every watcher ends at the key's final
  version, and the shards never restart;
- a handler (``evq handle``, both transports) goes on handling what is put through the
  other gateway after the one it was given first is SIGKILLed;
- every gateway is restarted in turn (SIGTERM, start again, wait until ready) under load:
  no operation fails for a client that retries as the client documents it (puts and acks
  are resent by the client; a take whose reply was lost is taken again by the caller, and
  what it had reserved comes back after its visibility timeout).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from evq.client import Client, RetryPolicy, TransportError
from tests.integration import handler_funcs
from tests.integration.server import Server, eventually
from tests.integration.test_handlers import Handle
from tests.integration.test_two_node import (
    HEAD_IP,
    SECOND_IP,
    SHARDS,
    Cluster,
    cluster_env,
    queue_per_shard,
    running_cluster,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

KEY = "storm:state"
VISIBILITY_S = 5.0  # what a lost take reserved is back this soon
RETRIES = RetryPolicy(retries=12, backoff=0.05, max_backoff=0.5)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with running_cluster() as c:
        yield c


@pytest.fixture(scope="module")
def gateways(cluster: Cluster) -> Iterator[list[Server]]:
    """Two gateways on different addresses and ports, started together."""
    servers = [
        Server(
            cluster.root / "data",
            *("--ray-address", cluster.address, "--shards", str(SHARDS)),
            *("--shard-spread", "--shard-resource", "evq_shard"),
            env=cluster_env(),
            log=cluster.root / f"gateway-{ip}.log",
            host=ip,
        )
        for ip in (HEAD_IP, SECOND_IP)
    ]
    try:
        with ThreadPoolExecutor(2) as pool:
            for started in [pool.submit(s.start, ready_timeout=180) for s in servers]:
                started.result()
        yield servers
    finally:
        for server in servers:
            if server.proc is not None and server.running():
                server.kill()


def shard_pids(cluster: Cluster) -> dict[int, int]:
    """Every running shard: index → pid, over both nodes."""
    return {**cluster.head.shards(), **cluster.second.shards()}


def both_running(gateways: list[Server]) -> None:
    for server in gateways:
        if not server.running():
            server.start(ready_timeout=180)


@dataclass
class Load:
    """Producers, consumers and watchers on clients that know every gateway."""

    urls: list[str]
    queues: list[str]
    stop_puts: threading.Event = field(default_factory=threading.Event)
    stop_all: threading.Event = field(default_factory=threading.Event)
    acked: list[str] = field(default_factory=list)
    put_times: list[float] = field(default_factory=list)
    consumed: list[str] = field(default_factory=list)
    take_retries: list[int] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    slowest_put_s: float = 0.0
    resent_puts: int = 0
    threads: list[threading.Thread] = field(default_factory=list)

    def client(self, i: int, timeout: float = 10.0) -> Client:
        """A client of every gateway, the ``i``-th one first."""
        order = self.urls[i % len(self.urls) :] + self.urls[: i % len(self.urls)]
        return Client(order, timeout=timeout, retries=RETRIES)

    def run(self, target: Callable[[int], None], i: int) -> None:
        def guarded() -> None:
            try:
                target(i)
            except BaseException as exc:  # reported by the test
                self.errors.append(exc)

        thread = threading.Thread(target=guarded, daemon=True)
        thread.start()
        self.threads.append(thread)

    def producer(self, i: int) -> None:
        with self.client(i) as client:
            n = 0
            while not self.stop_puts.is_set():
                queue = self.queues[(i + n) % len(self.queues)]
                body = f"p{i}-{n}"
                started = time.monotonic()
                [result] = client.put(queue, body)
                took = time.monotonic() - started
                # "duplicate": a resend of a put that the lost gateway had made durable.
                assert result.status in ("created", "duplicate"), (body, result)
                if result.status == "duplicate":
                    self.resent_puts += 1
                self.slowest_put_s = max(self.slowest_put_s, took)
                self.acked.append(body)
                self.put_times.append(time.monotonic())
                n += 1

    def consumer(self, i: int) -> None:
        queue = self.queues[i % len(self.queues)]
        with self.client(i) as client:
            retries = 0
            while not self.stop_all.is_set():
                try:
                    batch = client.take(queue, 50, wait=0.5, visibility_timeout=VISIBILITY_S)
                except TransportError:
                    # As the client documents: take again; what the lost reply reserved
                    # comes back after its visibility timeout.
                    retries += 1
                    continue
                for message in batch:
                    [done] = client.ack(queue, message)
                    assert done.status in ("ok", "not_found", "stale_lease"), done
                    self.consumed.append(message.body.decode())
            self.take_retries.append(retries)

    def all_consumed(self) -> bool:
        return set(self.acked) <= set(self.consumed)

    def finish(self, timeout: float = 90.0) -> None:
        """Stop the producers, wait until every acknowledged put was consumed, stop all."""
        self.stop_puts.set()
        try:
            eventually(
                lambda: self.errors or self.all_consumed(),
                timeout=timeout,
                interval=0.2,
                what="every acknowledged put consumed",
            )
        finally:
            self.stop_all.set()
            for thread in self.threads:
                thread.join(30)
        assert not self.errors, self.errors

    def check(self) -> None:
        """Nothing acknowledged lost, nothing doubled, nothing made up."""
        assert len(set(self.acked)) == len(self.acked)
        assert set(self.consumed) == set(self.acked)


def make_queues(urls: list[str]) -> list[str]:
    queues = list(queue_per_shard().values())
    with Client(urls, retries=RETRIES) as client:
        for queue in queues:
            client.create_queue(queue, visibility_timeout=VISIBILITY_S)
    return queues


def test_a_gateway_killed_in_a_put_storm_loses_nothing_and_its_watchers_carry_on(
    cluster: Cluster, gateways: list[Server], record_property: pytest.RecordProperty
) -> None:
    both_running(gateways)
    a, b = gateways
    urls = [a.url, b.url]
    queues = make_queues(urls)
    pids = shard_pids(cluster)
    assert sorted(pids) == list(range(SHARDS))
    assert cluster.head.shards(), "no shard on the head"
    assert cluster.second.shards(), "no shard on the second node"

    def listed() -> set[str]:  # the gateways b's /v1/status names (the cluster page's)
        with urllib.request.urlopen(f"{b.url}/v1/status", timeout=30) as resp:
            return {g["listen"] for g in json.loads(resp.read())["gateways"]}

    eventually(lambda: listed() == set(urls), timeout=20, interval=0.5, what="both listed")

    load = Load(urls, queues)
    final: dict[str, int] = {}
    seen: dict[int, int] = {}

    def watcher(i: int) -> None:
        # One-shot watches, each re-armed with the version held, on whichever gateway the
        # client is on: a change is never missed, changes between two polls fold.
        with load.client(i, timeout=30) as client:
            version = 0
            while not ("version" in final and version >= final["version"]):
                state = client.watch(KEY, version, wait=2)
                if state is not None:
                    assert state.version > version
                    version = state.version
                seen[i] = version
                if load.stop_all.is_set():
                    return

    def writer(i: int) -> None:
        with load.client(i) as client:
            n = 0
            while not load.stop_puts.is_set():
                client.set_key(KEY, {"n": n})
                n += 1
                time.sleep(0.05)
            final["version"] = client.set_key(KEY, {"n": "final"})

    for i in range(4):
        load.run(load.producer, i)
        load.run(load.consumer, i)
        load.run(watcher, i)
    load.run(writer, 0)

    time.sleep(4)
    before = len(load.acked)
    killed_at = time.monotonic()
    a.kill()  # SIGKILL: its connections die mid-request
    time.sleep(4)
    after = [t for t in load.put_times if t > killed_at]
    assert after, "no put succeeded after the kill"
    first_after_s = after[0] - killed_at
    load.finish()
    eventually(
        lambda: load.errors or all(seen.get(i) == final.get("version") for i in range(4)),
        timeout=30,
        interval=0.2,
        what="every watcher at the final version",
    )
    load.stop_all.set()
    assert not load.errors, load.errors
    load.check()
    assert all(seen[i] == final["version"] for i in range(4)), (seen, final)
    assert before > 0
    assert len(load.acked) > before
    assert shard_pids(cluster) == pids, "a shard restarted"
    print(
        f"\n{len(load.acked)} puts acknowledged ({len(after)} after the kill); first success "
        f"{first_after_s:.3f} s after the kill; slowest put {load.slowest_put_s:.3f} s; "
        f"take retries {sum(load.take_retries)}; puts found durable on resend {load.resent_puts}"
    )
    record_property("first_success_after_kill_s", round(first_after_s, 3))
    record_property("slowest_put_s", round(load.slowest_put_s, 3))


def test_a_rolling_restart_of_every_gateway_under_load_fails_no_operation(
    cluster: Cluster, gateways: list[Server]
) -> None:
    both_running(gateways)
    urls = [g.url for g in gateways]
    queues = make_queues(urls)
    pids = shard_pids(cluster)
    load = Load(urls, queues)
    for i in range(2):
        load.run(load.producer, i)
        load.run(load.consumer, i)
        load.run(load.consumer, i + 2)
    time.sleep(2)
    counts = [len(load.acked)]
    for server in gateways:
        assert server.stop(timeout=60) == 0  # graceful: SIGTERM, requests in flight answered
        server.start(ready_timeout=180)
        time.sleep(2)
        counts.append(len(load.acked))
    load.finish()
    load.check()
    assert counts == sorted(set(counts)), f"no progress in some step: {counts}"
    assert shard_pids(cluster) == pids, "a shard restarted"
    print(
        f"\nrolling restart: {len(load.acked)} puts, all consumed; take retries "
        f"{sum(load.take_retries)}; puts acknowledged after each step {counts}"
    )


@pytest.mark.parametrize("transport", ["direct", "http"])
def test_a_handler_carries_on_when_the_gateway_it_was_given_first_dies(
    cluster: Cluster, gateways: list[Server], tmp_path: Path, transport: str
) -> None:
    both_running(gateways)
    a, b = gateways
    queue = f"handled-{transport}"
    log = tmp_path / "log"
    with Client([b.url], retries=RETRIES) as client:
        client.create_queue(queue)
        ids = [r.id for r in client.put(queue, [json.dumps({"log": str(log)})] * 10)]
        handler = Handle(
            [
                "tests.integration.handler_funcs:record",
                *("--queue", queue, "--server", f"{a.url},{b.url}"),
                *("--ray-address", cluster.address, "--transport", transport),
                *("--num-cpus", "0", "--max-concurrency", "2"),
            ],
            tmp_path / "handle.out",
            env=cluster_env(),
        )
        try:

            def handled() -> set[str]:
                return {f[1] for f in handler_funcs.lines(str(log)) if f[0] == "handled"}

            def acked() -> int:
                stats = client.get_queue(queue).stats
                return stats.acked if stats is not None else -1

            eventually(lambda: handled() == set(ids), timeout=120, what=handler.output)
            # The kill comes between batches, not in the middle of an ack: one that lands
            # and whose reply dies with the gateway is not the handler's to count (its
            # retry through the other gateway finds the message gone).
            eventually(lambda: acked() == 10, timeout=60, what="10 acks")
            a.kill()
            ids += [r.id for r in client.put(queue, [json.dumps({"log": str(log)})] * 20)]
            eventually(lambda: handled() == set(ids), timeout=120, what=handler.output)
            eventually(lambda: acked() == 30, timeout=60, what="30 acks")
            assert handler.stop(timeout=60) == 0, handler.output()
            assert f"({transport}, stopped): acked 30" in handler.output()
        finally:
            handler.reap()
