"""More than one machine, simulated: a two-node Ray cluster on this machine, queues on both
nodes, the second node killed, its queues recovered on the first from the shared store.

Two ``ray start`` processes make the cluster: the head on 127.0.0.2 and a second node on
127.0.0.3 (loopback addresses both; Ray rewrites 127.0.0.1 itself to the machine's address
when nodes join, so the test avoids it). Both offer ``evq_shard``, and ``evq serve
--shard-spread --shard-resource evq_shard`` joins the cluster and spreads four shards over
them. The data directory is the store both nodes see, as S3 would be.

Killing the second node is SIGKILL to every process of its session — raylet, workers and
the shards on it — as if the machine lost power. Ray's health checks are tightened on the
head (a node is declared dead after 3 failed checks 0.5 s apart) so the test stays short;
the time from the kill until every queue of the dead node answers again is printed (and
kept as the test's ``failover_s`` property) for loadtest/RESULTS.md. With
``EVQ_TWO_NODE_HEALTH_CHECKS=default`` the head keeps Ray's default health checks instead.

Cleanup never uses ``ray stop`` (it kills every Ray process of the user): each node runs in
a session of its own and is stopped by killing that session's processes, whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from actors.shard import placement
from evq.client import Client, RetryPolicy
from tests.conftest import CREDENTIALS, REGION, S3Server
from tests.integration.resize_load import QUEUES, check_load, resize_under_load
from tests.integration.server import (
    Server,
    _alive,
    cmdline,
    eventually,
    free_port,
    kill_until_gone,
    request,
    server_env,
    session_pids,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

RAY = str(Path(sys.executable).with_name("ray"))
HEAD_IP, SECOND_IP = "127.0.0.2", "127.0.0.3"
SHARDS = 4
MESSAGES = 20  # per queue
TAKEN = 5  # of them reserved before the failure
# GCS side: how fast a node that stopped answering is declared dead.
HEALTH_CHECKS = {
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "3",
}
CLUSTER_SECRET = "two-node-tests-cluster-secret"
_SHARD_LINE = re.compile(r"actors\.shard: shard (\d+)/\d+: recovering")


def cluster_env() -> dict[str, str]:
    """Ray without token auth, usage stats or the single-node restriction; tight health
    checks unless ``EVQ_TWO_NODE_HEALTH_CHECKS=default`` (to measure Ray's own defaults)."""
    tight = os.environ.get("EVQ_TWO_NODE_HEALTH_CHECKS") != "default"
    return server_env(
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="1",
        EVQ_CLUSTER_SECRET=CLUSTER_SECRET,
        # moto's: the shards read them when the store is in the tests' S3 server
        AWS_ACCESS_KEY_ID=CREDENTIALS["access_key_id"],
        AWS_SECRET_ACCESS_KEY=CREDENTIALS["secret_access_key"],
        AWS_REGION=REGION,
        **(HEALTH_CHECKS if tight else {}),
    )


def ray_status(address: str) -> str:
    """What ``ray status`` says of the cluster at ``address`` ("" when it did not answer:
    before the head's GCS is up, ``ray status`` may wait for it longer than we do)."""
    try:
        return subprocess.run(
            [RAY, "status", "--address", address],
            env=cluster_env(),
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
    except subprocess.TimeoutExpired:
        return ""


class RayNode:
    """One ``ray start --block`` in a session of its own (environment: ``cluster_env()``
    unless ``env`` is given)."""

    def __init__(
        self, name: str, args: list[str], log: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.args = args
        self.log_path = log
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RayNode:
        """Start the node (returns at once; Ray joins it to the cluster in the background)."""
        ports = [
            *("--node-manager-port", str(free_port())),
            *("--object-manager-port", str(free_port())),
            *("--dashboard-agent-listen-port", str(free_port())),
            *("--dashboard-agent-grpc-port", str(free_port())),
            *("--runtime-env-agent-port", str(free_port())),
            *("--metrics-export-port", str(free_port())),
            *("--min-worker-port", "0", "--max-worker-port", "0"),  # any free port
        ]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [RAY, "start", "--block", "--disable-usage-stats", *self.args, *ports],
                env=self.env or cluster_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def pids(self) -> list[int]:
        """Live processes of the node (its session: raylet, agents, workers)."""
        if self.proc is None:
            return []
        return [p for p in session_pids(self.proc.pid) if _alive(p)]

    def shards(self) -> dict[int, int]:
        """Shard actors running on this node: index → pid."""
        found = {}
        for pid in self.pids():
            if not cmdline(pid).startswith("ray::ShardActor"):
                continue
            with contextlib.suppress(OSError), open(os.readlink(f"/proc/{pid}/fd/2")) as f:
                for m in _SHARD_LINE.finditer(f.read()):
                    found[int(m.group(1))] = pid
        return found

    def kill(self) -> None:
        """SIGKILL every process of the node until none is left."""
        if self.proc is None:
            return
        kill_until_gone(self.pids)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def log(self) -> str:
        """What ``ray start`` printed."""
        return self.log_path.read_text(errors="replace")[-3000:]


class Cluster:
    """A head and a second node on loopback addresses, in a temp dir of their own."""

    def __init__(self) -> None:
        # Short: Ray puts Unix sockets under it (a socket path holds at most 107 bytes).
        self.root = Path(tempfile.mkdtemp(prefix="evq2n-", dir="/tmp"))
        self.gcs_port = free_port()
        self.address = f"{HEAD_IP}:{self.gcs_port}"
        shard_slots = json.dumps({"evq_shard": 2 * SHARDS})
        self.head = RayNode(
            "head",
            [
                "--head",
                *("--port", str(self.gcs_port), "--node-ip-address", HEAD_IP),
                *("--num-cpus", "1", "--resources", shard_slots),
                *("--include-dashboard", "false", "--temp-dir", str(self.root)),
            ],
            self.root / "head.log",
        )
        self.second = RayNode(
            "second",
            [
                *("--address", self.address, "--node-ip-address", SECOND_IP),
                *("--num-cpus", "1", "--resources", shard_slots),
            ],
            self.root / "second.log",
        )

    def start(self) -> None:
        """Start both nodes; wait until the cluster has two nodes.

        Raises:
            AssertionError: the nodes did not join in time (their output in the message).
        """
        self.head.start()
        self.second.start()  # it waits for the head's GCS by itself
        eventually(self._two_nodes, timeout=60, interval=1.0, what=self._logs())

    def _two_nodes(self) -> bool:
        for node in (self.head, self.second):
            if node.proc is None or node.proc.poll() is not None:  # fail now, not at timeout
                raise RuntimeError(f"ray start of the {node.name} node exited:\n{self._logs()}")
        status = ray_status(self.address)
        return status.count(" node_") == 2 and "0.0/16.0 evq_shard" in status

    def _logs(self) -> str:
        return f"head:\n{self.head.log()}\nsecond:\n{self.second.log()}"

    def stop(self) -> None:
        """Kill both nodes and remove the temp dir."""
        self.second.kill()
        self.head.kill()
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def running_cluster() -> Iterator[Cluster]:
    """A running two-node cluster, always stopped at the end."""
    c = Cluster()
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with running_cluster() as c:
        yield c


@contextlib.contextmanager
def serving(cluster: Cluster, shards: int, *store: str) -> Iterator[Server]:
    """``evq serve`` joined to the cluster, spreading its shards over both nodes (``store``:
    options naming another store than the data directory)."""
    server = Server(
        cluster.root / "data",
        *("--ray-address", cluster.address, "--shards", str(shards), *store),
        *("--shard-spread", "--shard-resource", "evq_shard"),
        env=cluster_env(),
        log=cluster.root / "serve.log",
    )
    try:
        yield server.start(ready_timeout=90)
    finally:
        if server.proc is not None:
            try:
                if server.running():
                    server.stop(timeout=45)
                else:
                    server._reap_session(0)
            except Exception:
                server.kill()


@pytest.fixture
def gateway(cluster: Cluster) -> Iterator[Server]:
    with serving(cluster, SHARDS) as server:
        yield server


def queue_per_shard() -> dict[int, str]:
    """A queue name placed on each shard."""
    names: dict[int, str] = {}
    for i in range(10_000):
        names.setdefault(placement(f"two-node-{i}", SHARDS), f"two-node-{i}")
        if len(names) == SHARDS:
            return names
    raise AssertionError("no name for some shard")


def stats(server: Server, queue: str) -> dict[str, int] | None:
    """The queue's counters, or None while it does not answer."""
    status, doc = request("GET", f"{server.url}/v1/queues/{queue}", timeout=5)
    return doc["stats"] if status == 200 else None


def wait_all(check: Callable[[str], bool], queues: list[str], timeout: float) -> float:
    """Poll until ``check`` holds for every queue; answer the seconds it took."""
    start = time.monotonic()
    pending = set(queues)
    while pending:
        pending = {q for q in pending if not check(q)}
        if pending and time.monotonic() - start > timeout:
            raise AssertionError(f"queues {sorted(pending)} did not answer within {timeout}s")
        time.sleep(0.05)
    return time.monotonic() - start


def test_queues_of_a_dead_node_recover_on_the_surviving_one(
    cluster: Cluster, gateway: Server, record_property: Callable[[str, object], None]
) -> None:
    queues = queue_per_shard()
    for shard, queue in queues.items():
        assert request("PUT", f"{gateway.url}/v1/queues/{queue}", {})[0] == 201
        bodies = [{"body": f"{queue}-{k}"} for k in range(MESSAGES)]
        status, _ = request(
            "POST", f"{gateway.url}/v1/queues/{queue}/messages", {"messages": bodies}
        )
        assert status == 200, shard
        status, doc = request(
            "POST",
            f"{gateway.url}/v1/queues/{queue}/take",
            {"max": TAKEN, "visibility_timeout": 600},
        )
        assert status == 200
        assert len(doc["messages"]) == TAKEN

    # Spread placement put shards (so queues) on both nodes.
    on_head, on_second = cluster.head.shards(), cluster.second.shards()
    assert sorted([*on_head, *on_second]) == list(range(SHARDS)), (on_head, on_second)
    assert on_head, "no shard on the head"
    assert on_second, "no shard on the second node"
    lost = [queues[s] for s in on_second]
    kept = [queues[s] for s in on_head]

    died = time.monotonic()
    cluster.second.kill()
    killed_s = time.monotonic() - died
    # The head's queues never stop answering.
    for queue in kept:
        assert stats(gateway, queue) is not None, queue
    answered_s = wait_all(lambda q: stats(gateway, q) is not None, lost, timeout=60)
    failover_s = killed_s + answered_s
    record_property("failover_s", round(failover_s, 2))
    print(f"\ntwo-node failover: {len(lost)} queue(s) answered {failover_s:.2f} s after node death")

    # Ray restarted the lost shards on the head, which recovered their queues from the store.
    assert sorted(cluster.head.shards()) == list(range(SHARDS))
    for queue in queues.values():
        counts = stats(gateway, queue) or {}
        assert (counts.get("ready"), counts.get("reserved")) == (MESSAGES - TAKEN, TAKEN), queue
        status, doc = request(
            "POST",
            f"{gateway.url}/v1/queues/{queue}/take",
            {"max": MESSAGES, "visibility_timeout": 600},
        )
        assert status == 200
        got = sorted(m["body"] for m in doc["messages"])
        assert got == sorted(f"{queue}-{k}" for k in range(TAKEN, MESSAGES)), queue
    assert "did not recover" not in gateway.log()


@pytest.mark.timeout(600)
def test_a_cluster_grows_to_both_nodes_and_shrinks_under_load_and_loses_nothing(
    cluster: Cluster,
) -> None:
    """Issue 34 on the two-node set-up: ``evq shards resize`` 1 → 4 → 2 while 64 producers,
    16 consumers, long-poll takes and 1,000 watchers run. The new shards start spread over
    both nodes; the shrink stops the two it drained; nothing acknowledged is lost, no acked
    message comes back, every watcher ends at its key's final version, every queue ends on
    the shard the map names."""
    where: dict[int, tuple[dict[int, int], dict[int, int]]] = {}

    def on_nodes(count: int) -> None:
        def settled() -> bool:
            head, second = cluster.head.shards(), cluster.second.shards()
            where[count] = (head, second)
            return sorted([*head, *second]) == list(range(count))

        eventually(settled, timeout=30, interval=0.5, what=lambda: f"shards at {count}: {where}")

    with serving(cluster, 1) as server:
        queues = [f"two-node-rz{i}" for i in range(QUEUES)]
        for queue in queues:
            assert request("PUT", f"{server.url}/v1/queues/{queue}", {})[0] == 201
        load = asyncio.run(resize_under_load(server, queues, after=on_nodes))
        check_load(server, queues, load, count=2)
        head, second = where[4]
        assert head, where  # grown onto both nodes
        assert second, where
        assert "did not recover" not in server.log()


def _putting(
    url: str, queue: str, acked: list[str], errors: list[str], stop: threading.Event
) -> None:
    """Put batches of five until ``stop``; note the bodies the server answered for. The
    client retries (with each message's idempotency key) through the failover."""
    retries = RetryPolicy(retries=200, backoff=0.05, max_backoff=0.5)
    with Client(url, retries=retries, timeout=10) as client:
        n = 0
        while not stop.is_set():
            bodies = [f"during-{n}-{i}" for i in range(5)]
            try:
                client.put(queue, bodies)
            except Exception as exc:  # the test fails on any
                errors.append(repr(exc))
                return
            acked += bodies
            n += 1
            time.sleep(0.02)


@pytest.mark.parametrize("store", ["local", "s3"])
@pytest.mark.timeout(400)
def test_a_shard_paused_past_the_health_checks_is_a_zombie_whose_writes_never_land(
    cluster: Cluster, store: str, request: pytest.FixtureRequest
) -> None:
    """Issue 34's zombie, through ``evq serve`` on the two-node set-up: every process of the
    second node (raylet, shards) is paused (SIGSTOP) past Ray's health checks while puts
    go on; Ray restarts its shards on the head; the node is resumed with the writes it had
    in flight and its leases and delayed messages come due, then Ray's dead node ends.

    On a local disk the new incarnation cannot open the log while the paused one holds its
    lock (it waits, the queue answers 503); on S3 it claims a newer epoch and serves at once,
    so the zombie's writes meet its claim. Either way: every put answered is there once, the
    leases taken before the pause still ack, and the store holds what the live shard showed:
    the shards stopped and started again from it find the same queue."""
    options: tuple[str, ...] = ()
    if store == "s3":
        s3: S3Server = request.getfixturevalue("s3_server")
        options = (
            *("--store", f"s3://{s3.bucket}/{s3.fresh_prefix()}"),
            *("--endpoint", s3.endpoint, "--region", REGION),
            *("--segment-cache", str(cluster.root / "cache")),
        )
    with serving(cluster, SHARDS, *options) as server:
        on_second = cluster.second.shards()
        assert on_second, "no shard on the second node"
        index, zombie = sorted(on_second.items())[0]
        queue = next(
            f"zombie-{i}" for i in range(10_000) if placement(f"zombie-{i}", SHARDS) == index
        )
        with Client(server.url, retries=0, timeout=30) as c:
            c.create_queue(queue)
            c.put(queue, [f"before-{k}" for k in range(20)])
            held = c.take(queue, 5, visibility_timeout=600)
            short = c.take(queue, 3, visibility_timeout=2)  # their leases end in the pause
            c.put(queue, [f"delayed-{k}" for k in range(3)], delay=2)  # due in the pause
        assert (len(held), len(short)) == (5, 3)
        zombie_log = os.readlink(f"/proc/{zombie}/fd/2")

        acked: list[str] = []
        errors: list[str] = []
        stop = threading.Event()
        putter = threading.Thread(target=_putting, args=(server.url, queue, acked, errors, stop))
        putter.start()
        try:
            time.sleep(1)
            paused = cluster.second.pids()
            for pid in paused:
                os.kill(pid, signal.SIGSTOP)
            try:
                # Ray declares the node dead and starts the shard again on the head.
                eventually(lambda: index in cluster.head.shards(), timeout=60, interval=0.5)
                if store == "s3":  # the new incarnation serves while the old one sleeps
                    wait_all(lambda q: _answers(server, q), [queue], timeout=60)
                    with Client(server.url, retries=0, timeout=30) as c:
                        assert [r.status for r in c.ack(queue, *held[:2])] == ["ok"] * 2
                else:  # it waits for the log's lock: the queue does not answer meanwhile
                    time.sleep(3)
                    assert not _answers(server, queue)
            finally:
                for pid in paused:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
            # The zombie runs again (its batch in flight, its timers due) until Ray ends its
            # node; should that not happen, it runs beside the new incarnation a while, then
            # its node is killed.
            deadline = time.monotonic() + 20
            while _alive(zombie) and time.monotonic() < deadline:
                time.sleep(0.2)
            outlived = _alive(zombie)
            if outlived:
                time.sleep(3)
                cluster.second.kill()
            print(f"\nzombie ({store}): {'killed' if outlived else 'exited by itself'}")
            wait_all(lambda q: _answers(server, q), [queue], timeout=60)
            time.sleep(1)
        finally:
            stop.set()
            putter.join(60)
        assert errors == []
        assert len(acked) > 50

        with Client(server.url, retries=0, timeout=30) as c:
            results = c.ack(queue, *held[2 if store == "s3" else 0 :])
            assert {r.status for r in results} == {"ok"}  # leases taken before the pause
            taken: dict[str, str] = {}
            while batch := c.take(queue, 1000, visibility_timeout=600):
                taken.update((m.id, m.body_text) for m in batch)
            live = c.get_queue(queue).stats
        found = list(taken.values())
        assert len(found) == len(set(found)), "a message twice"
        assert set(acked) <= set(found)  # every put answered is there
        expected = {f"before-{k}" for k in range(20)} - {m.body_text for m in held}
        expected |= {f"delayed-{k}" for k in range(3)}
        assert expected <= set(found)  # the short leases ended: those three came back
        assert all(b in expected or b.startswith("during-") for b in found)

        print(f"\nzombie ({store}): {_fenced_lines(zombie_log)}")
        # What the store holds: stop the shards, start them again from it.
        assert server.stop(timeout=45) == 0
        done = subprocess.run(
            [sys.executable, "-m", "evq", "shards", "stop", "--ray-address", cluster.address],
            env=cluster_env(),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        server.start(ready_timeout=90)
        with Client(server.url, retries=0, timeout=30) as c:
            after = c.get_queue(queue).stats
            states = {c.get_message(queue, i).state for i in taken}
        assert (after.ready, after.reserved, after.delayed) == (live.ready, live.reserved, 0)
        assert after.total == live.total == len(found)
        assert states == {"reserved"}  # each message taken from the live shard, as it was


def _answers(server: Server, queue: str) -> bool:
    """Whether the queue answers within 5 s."""
    try:
        return stats(server, queue) is not None
    except OSError:  # no answer in time
        return False


def _fenced_lines(path: str) -> str:
    """What the zombie's log says of its end (for the test's output)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        return f"(log unreadable: {exc})"
    lines = [line for line in text.splitlines() if re.search(r"(?i)fenced|held by another", line)]
    return "\n".join(lines[-5:]) or "(no write of it was refused)"
